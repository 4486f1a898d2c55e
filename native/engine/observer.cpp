#include "observer.h"

#include <algorithm>

engine_observer::engine_observer(int32_t n_slots, int32_t n_ctx_seq, bool embeddings, int32_t n_lanes)
    : n_slots_(n_slots), n_ctx_seq_(n_ctx_seq), embeddings_(embeddings), lanes_(std::max(1, n_lanes)) {}

void engine_observer::queued(int64_t id_request, uint64_t t_submit_us, int32_t n_prompt) {
    std::lock_guard<std::mutex> hooks(mu_hooks_);
    request_clock & clock = clocks_[id_request];
    clock.t_submit_us = t_submit_us;
    clock.n_prompt = n_prompt;
}

void engine_observer::admitted(const plan_admission & admission) {
    std::lock_guard<std::mutex> hooks(mu_hooks_);
    auto it = clocks_.find(admission.id_request);
    if (it == clocks_.end()) {
        return;
    }
    request_clock & clock = it->second;
    clock.t_admit_us = steady_now_us();
    clock.n_cached = admission.n_keep;
    hist_.queue_time.observe(clock.t_admit_us - clock.t_submit_us);
    pending_.n_prompt_tokens += clock.n_prompt;
    pending_.n_prefix_cache_hit_tokens += admission.n_keep;
}

void engine_observer::token(int64_t id_request) {
    std::lock_guard<std::mutex> hooks(mu_hooks_);
    auto it = clocks_.find(id_request);
    if (it == clocks_.end()) {
        return;
    }
    request_clock & clock = it->second;
    const uint64_t now = steady_now_us();
    if (clock.t_first_us == 0) {
        clock.t_first_us = now;
        hist_.time_to_first_token.observe(now - clock.t_submit_us);
    } else {
        hist_.inter_token_latency.observe(now - clock.t_last_us);
    }
    clock.t_last_us = now;
    clock.n_generated += 1;
    pending_.n_generation_tokens += 1;
}

void engine_observer::drafted(int64_t id_request, int32_t n_drafted, int32_t n_accepted) {
    std::lock_guard<std::mutex> hooks(mu_hooks_);
    auto it = clocks_.find(id_request);
    if (it != clocks_.end()) {
        it->second.n_drafted += n_drafted;
        it->second.n_draft_accepted += n_accepted;
    }
}

request_timings engine_observer::finished(int64_t id_request, request_status status) {
    std::lock_guard<std::mutex> hooks(mu_hooks_);
    switch (status) {
        case REQUEST_STATUS_FINISHED_STOPPED: pending_.n_finished_stop += 1; break;
        case REQUEST_STATUS_FINISHED_LENGTH:  pending_.n_finished_length += 1; break;
        case REQUEST_STATUS_FINISHED_ABORTED: pending_.n_cancelled += 1; break;
        default:                              pending_.n_errors += 1; break;
    }
    auto it = clocks_.find(id_request);
    if (it == clocks_.end()) {
        return {};                         // refused before it was queued
    }
    const request_clock clock = it->second;
    clocks_.erase(it);
    const uint64_t now = steady_now_us();
    const bool success = status == REQUEST_STATUS_FINISHED_STOPPED || status == REQUEST_STATUS_FINISHED_LENGTH;
    if (success) {
        hist_.e2e_request_latency.observe(now - clock.t_submit_us);
        hist_.request_prompt_tokens.observe((uint64_t) clock.n_prompt);
        hist_.request_generation_tokens.observe((uint64_t) clock.n_generated);
        if (embeddings_) {                 // an embedding request is admitted and done at once
            pending_.n_prompt_tokens += clock.n_prompt;
        }
    }
    if (trace_.on()) {
        trace_request(id_request, clock, status, now);
    }
    return timings_of(clock);
}

void engine_observer::trace_request(int64_t id_request, const request_clock & clock, request_status status,
                                    uint64_t now) {
    trace_record r{TRACE_REQUEST};
    r.status = (uint8_t) status;
    r.id_request = id_request;
    r.t_begin_us = clock.t_submit_us;
    r.t_end_us = now;
    r.t_admit_us = clock.t_admit_us;
    r.t_first_us = clock.t_first_us;
    r.t_last_us = clock.t_last_us;
    r.n_tokens = clock.n_generated;
    r.n_prompt = clock.n_prompt;
    r.n_cached = clock.n_cached;
    trace_.add(r);
}

void engine_observer::step(const batch_plan & plan, uint64_t t_begin_us, const engine_stats & delta) {
    if (!trace_.on()) {
        return;
    }
    std::lock_guard<std::mutex> hooks(mu_hooks_);
    trace_record s{TRACE_STEP};
    s.t_begin_us = t_begin_us;
    s.d_us[PHASE_SCHEDULE] = (uint32_t) delta.t_schedule_us;
    s.d_us[PHASE_BATCH] = (uint32_t) delta.t_batch_us;
    s.d_us[PHASE_DECODE] = (uint32_t) delta.t_decode_us;
    s.d_us[PHASE_SAMPLE] = (uint32_t) delta.t_sample_us;
    s.d_us[PHASE_EMIT] = (uint32_t) delta.t_emit_us;
    s.t_end_us = t_begin_us + delta.t_schedule_us + delta.t_batch_us + delta.t_decode_us + delta.t_sample_us +
                 delta.t_emit_us;
    s.n_items = (int32_t) plan.items.size();
    s.n_tokens = plan.n_tokens;
    s.n_sampled = (int32_t) delta.n_tokens_sampled;
    trace_.add(s);
    const uint64_t t_decode = t_begin_us + delta.t_schedule_us + delta.t_batch_us;
    for (const plan_item & item : plan.items) {
        if (item.is_prompt) {
            trace_record p{TRACE_PREFILL};
            p.id_request = item.id_request;
            p.t_begin_us = t_decode;
            p.t_end_us = t_decode + delta.t_decode_us;
            p.n_tokens = item.n_tokens;
            trace_.add(p);
        }
    }
}

void engine_observer::after_step(int32_t lane, const scheduler & sched, int32_t n_queued, int32_t n_embed_jobs) {
    lane_gauges mine;
    for (int32_t i = 0; i < (int32_t) sched.params().n_slots && !embeddings_; ++i) {
        const slot_info & slot = sched.slot(i);
        if (slot.id_request >= 0) {
            mine.n_busy += 1;
            mine.n_cells += slot.cache.size();
        }
    }
    mine.n_running = sched.n_running();
    mine.n_preempted = sched.n_waiting_preempted();
    std::lock_guard<std::mutex> hooks(mu_hooks_);
    lanes_[lane] = mine;
    lane_gauges sum;
    for (const lane_gauges & g : lanes_) {
        sum.n_running += g.n_running;
        sum.n_preempted += g.n_preempted;
        sum.n_busy += g.n_busy;
        sum.n_cells += g.n_cells;
    }
    const double n_total = embeddings_ ? 0.0 : (double) n_slots_ * n_ctx_seq_;
    gauges_.num_requests_running.store(sum.n_running + n_embed_jobs, std::memory_order_relaxed);
    // the engine's queue, and what preemption put back in a lane's (no longer in that queue)
    gauges_.num_requests_waiting.store(std::max(0, n_queued - n_embed_jobs) + sum.n_preempted,
                                       std::memory_order_relaxed);
    gauges_.slots_busy.store(sum.n_busy + n_embed_jobs, std::memory_order_relaxed);
    gauges_.kv_cache_usage_ratio.store(n_total > 0 ? (double) sum.n_cells / n_total : 0.0, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    totals_ += pending_;
    pending_ = engine_stats{};
}

engine_stats engine_observer::counters() const {
    std::lock_guard<std::mutex> lock(mu_);
    return totals_;
}
