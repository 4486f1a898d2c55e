#include "engine.h"

#include "model_facts.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace {

uint64_t now_us() {
    return (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

// llama.cpp resolves "auto" by checking that each layer's attention runs on the layer's own
// device. Our kernels' ACCEL device (kernels/) runs whole CPU graphs, attention included, in
// the CPU's place, so that check would turn flash attention off for a model it serves, and
// change its arithmetic and speed against engine.kernels = off. On the CPU, where the check
// would otherwise pass, auto means on.
int32_t resolved_flash_attn(int32_t requested) {
    if (requested == LLAMA_FLASH_ATTN_TYPE_AUTO && ggml_backend_reg_by_name("STACKD") != nullptr) {
        return LLAMA_FLASH_ATTN_TYPE_ENABLED;
    }
    return requested;
}

// ggml computes attention over a quantized V only in its flash-attention kernel (llama.cpp
// refuses such a context otherwise), so a quantized KV cache turns it on whatever was asked.
int32_t flash_attn_for(int32_t requested, int32_t kv_type) {
    return kv_type == GGML_TYPE_F16 ? resolved_flash_attn(requested) : LLAMA_FLASH_ATTN_TYPE_ENABLED;
}

void batch_add(llama_batch & batch, int32_t token, int32_t pos, int32_t seq, bool logits) {
    const int32_t i = batch.n_tokens++;
    batch.token[i] = token;
    batch.pos[i] = pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i] = logits;
}

// An owner's share of `n` places: at least one, all of them when the share is 1.
int32_t share_of(float share, int32_t n) {
    return std::max(1, std::min(n, (int32_t) std::floor(share * (float) n)));
}

// Lane `index`'s share of the slots: an even share, the first lanes taking one more.
int32_t lane_slots(const engine_params & p, int32_t index) {
    const int32_t n_lanes = p.n_lanes;
    return p.slots / n_lanes + (index < p.slots % n_lanes ? 1 : 0);
}

scheduler_params scheduler_params_of(const engine_params & p, int32_t index) {
    const int32_t n_slots = lane_slots(p, index);
    scheduler_params sp;
    sp.n_slots = n_slots;
    sp.n_batch = std::max(p.batch, n_slots);
    sp.n_ctx_seq = p.context_length;
    sp.n_max_waiting = p.max_queue;
    sp.n_max_slots_per_owner = share_of(p.key_share, n_slots);
    sp.share_time = p.key_share < 1.0f;
    sp.n_draft_max = p.speculative_draft_max;
    sp.n_draft_step_tokens = p.speculative_step_tokens;
    return sp;
}

// Embedding models, a single slot and tensor parallelism get one lane; never more lanes than slots.
engine_params with_lanes_resolved(engine_params p) {
    p.n_lanes = p.embeddings || p.tp_rank >= 0 ? 1 : std::max(1, std::min(p.n_lanes, p.slots));
    return p;
}

bool any_ends_a_request(const std::vector<engine_event> & events) {
    for (const engine_event & ev : events) {
        if (request_status_is_finished(ev.status)) {
            return true;
        }
    }
    return false;
}

}  // namespace

engine::engine(const engine_params & params)
    : params_(with_lanes_resolved(params)),
      n_max_owned_(share_of(params.key_share, params.max_queue + params.slots)),
      obs_(params.slots, params.context_length, params.embeddings, params_.n_lanes) {
    if (params_.quiet) {
        quiet_llama_log();
    }
    llama_backend_init();
    if (params_.tp_rank >= 0) {
        if (params_.embeddings) {
            throw std::invalid_argument("tensor parallelism does not split embedding models");
        }
        if (params_.tp_size < 2 || params_.tp_rank >= params_.tp_size) {
            throw std::invalid_argument("tensor parallelism: rank " + std::to_string(params_.tp_rank) + " of " +
                                        std::to_string(params_.tp_size) + " nodes (at least 2)");
        }
    }
    tp_ = std::make_unique<lockstep>(params_.tp_rank, params_.tp_rank >= 0 ? make_transport(params_.tp_transport)
                                                                           : nullptr);

    llama_model_params mp = llama_model_default_params();
    model_devices devices(params_.placement);
    devices.apply(mp);
    model_ = llama_model_load_from_file(params_.model_path.c_str(), mp);
    if (model_ == nullptr) {
        throw std::runtime_error("cannot load model " + params_.model_path);
    }
    vocab_ = llama_model_get_vocab(model_);

    const int32_t n_threads = params_.threads > 0 ? params_.threads
                                                  : (int32_t) std::max(1u, std::thread::hardware_concurrency());
    n_threads_full_ = n_threads;
    llama_context_params cp = llama_context_default_params();
    cp.n_threads = cp.n_threads_batch = n_threads;
    cp.no_perf = true;
    cp.flash_attn_type = (llama_flash_attn_type) flash_attn_for(params_.flash_attn, params_.kv_type);
    cp.type_k = cp.type_v = (ggml_type) params_.kv_type;
    if (params_.embeddings) {
        // Whole sequences must fit one micro-batch: encoder models attend both ways.
        const int32_t n = std::max(params_.batch, llama_model_n_ctx_train(model_));
        cp.embeddings = true;
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n;
        cp.n_seq_max = std::min(params_.slots, 64);
    } else {
        // One KV stream per slot, each exactly n_ctx_seq long (the scheduler keeps every
        // sequence within it). Separate streams also make a sequence's attention independent
        // of its neighbours: with a unified buffer the masked cells of other sequences change
        // the summation order, and greedy output under load drifts from the same prompt alone.
        // (n_ctx, n_batch and n_seq_max are the lane's: make_lanes)
        cp.n_ubatch = params_.n_ubatch > 0 ? params_.n_ubatch : 512;
        cp.kv_unified = false;
    }

    for (int32_t t = 0; t < llama_vocab_n_tokens(vocab_); ++t) {
        if (llama_vocab_is_eog(vocab_, t)) {
            eog_tokens_.push_back(t);
        }
    }
    try {
        make_lanes(cp);
        efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (efd_ < 0) {
            throw std::runtime_error("eventfd failed");
        }
    } catch (...) {
        for (auto & ln : lanes_) {
            unload_lane(*ln);
        }
        llama_model_free(model_);
        throw;
    }
    if (params_.tp_rank > 0) {
        return;                        // a follower schedules nothing: follow() drives its context
    }
    for (auto & ln : lanes_) {
        lane * mine = ln.get();
        ln->thread = std::thread([this, mine] { loop(*mine); });
    }
}

void engine::make_lanes(const llama_context_params & base) {
    for (int32_t i = 0; i < params_.n_lanes; ++i) {
        auto ln = std::make_unique<lane>(scheduler_params_of(params_, i));
        ln->index = i;
        ln->n_slots = lane_slots(params_, i);
        llama_context_params cp = base;
        if (!params_.embeddings) {
            cp.n_ctx = (uint32_t) params_.context_length * ln->n_slots;
            cp.n_batch = std::max(params_.batch, ln->n_slots);
            cp.n_ubatch = std::min(cp.n_ubatch, cp.n_batch);
            cp.n_seq_max = ln->n_slots;
        }
        ln->ctx = llama_init_from_model(model_, cp);
        if (ln->ctx == nullptr) {
            throw std::runtime_error("cannot create a context for " + params_.model_path);
        }
        ln->batch = llama_batch_init((int32_t) cp.n_batch, 0, 1);
        lanes_.push_back(std::move(ln));
    }
}

// Sampler chains go before the context they belong with.
void engine::unload_lane(lane & ln) {
    ln.live.clear();
    if (ln.ctx != nullptr) {
        llama_batch_free(ln.batch);
        llama_free(ln.ctx);
        ln.ctx = nullptr;
    }
}

engine::~engine() {
    close();
    if (efd_ >= 0) {
        ::close(efd_);
    }
}

void engine::close() {
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        if (stop_ && (lanes_.empty() || !lanes_.front()->thread.joinable())) {
            return;
        }
        stop_ = true;
    }
    cv_.notify_all();
    follow_stop_ = true;
    { std::lock_guard<std::mutex> following(mu_follow_); }   // a follow() in progress has returned
    for (auto & ln : lanes_) {
        if (ln->thread.joinable()) {
            ln->thread.join();
        }
    }
    if (tp_) {
        tp_->stop();                   // a leader's followers stop (their follow() returns "stop")
    }
    for (auto & ln : lanes_) {
        unload_lane(*ln);
    }
    if (model_ != nullptr) {
        llama_model_free(model_);
        model_ = nullptr;
    }
}

// ---- the caller's side ---------------------------------------------------------------------

// An owner's requests count against its share from submit to their end, queued or running: a
// count of the queued ones alone would give a key new room each time the engine admitted some
// of its requests, so how many it held would depend on how fast the engine took them.
submit_result engine::enter_queue(int64_t id_owner) {
    std::lock_guard<std::mutex> lock(mu_tasks_);
    if (n_queued_ >= params_.max_queue) {
        return SUBMIT_QUEUE_FULL;
    }
    int32_t & mine = n_owned_of_[id_owner];
    if (mine >= n_max_owned_) {
        return SUBMIT_OVER_SHARE;
    }
    mine += 1;
    n_queued_ += 1;
    return SUBMIT_ACCEPTED;
}

void engine::leave_queue() {
    std::lock_guard<std::mutex> lock(mu_tasks_);
    n_queued_ -= 1;
}

void engine::leave_engine(int64_t id_owner) {
    std::lock_guard<std::mutex> lock(mu_tasks_);
    auto it = n_owned_of_.find(id_owner);
    if (it != n_owned_of_.end() && --it->second <= 0) {
        n_owned_of_.erase(it);
    }
}

void engine::leave_queue_and_engine(int64_t id_owner) {
    leave_queue();
    leave_engine(id_owner);
}

submit_result engine::submit(generation_request req) {
    if (params_.embeddings) {
        throw std::invalid_argument("this is an embedding model: it does not generate");
    }
    if (params_.tp_rank > 0) {
        throw std::runtime_error("a tensor-parallel follower takes no requests: its leader's engine does");
    }
    const submit_result admitted = enter_queue(req.id_owner);
    if (admitted != SUBMIT_ACCEPTED) {
        return admitted;
    }
    task t{task::TASK_SUBMIT, req.id_request, req.id_owner, nullptr, nullptr, {}};
    try {
        t.sampler = std::make_unique<request_sampler>(req.sampling, vocab_);   // may throw: bad grammar
    } catch (...) {
        leave_queue_and_engine(req.id_owner);
        throw;
    }
    t.request = std::make_unique<generation_request>(std::move(req));
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        if (lanes_.size() == 1) {
            lanes_.front()->tasks.push_back(std::move(t));
        } else {
            pending_.push_back(std::move(t));
        }
    }
    cv_.notify_all();
    return SUBMIT_ACCEPTED;
}

// How many queued requests a lane takes: no more than its free slots, so what it holds waits
// only for its own running requests; and, while another lane has room too, no more than its
// even share of all that is held and queued, so a burst spreads over the lanes.
int32_t engine::n_to_take(const lane & ln) const {
    if (pending_.empty()) {
        return 0;
    }
    int32_t n_total = (int32_t) pending_.size(), n_free_elsewhere = 0;
    for (const auto & other : lanes_) {
        n_total += other->n_held;
        if (other.get() != &ln) {
            n_free_elsewhere += other->n_slots - other->n_held;
        }
    }
    int32_t n = std::min((int32_t) pending_.size(), ln.n_slots - ln.n_held);
    if (n_free_elsewhere > 0) {
        const int32_t n_lanes = (int32_t) lanes_.size();
        n = std::min(n, (n_total + n_lanes - 1) / n_lanes - ln.n_held);
    }
    return std::max(0, n);
}

// Oldest first among the owners that hold fewest requests in the lanes.
void engine::take_pending(lane & ln, std::vector<task> & incoming) {
    for (int32_t n = n_to_take(ln); n > 0; --n) {
        auto pick = pending_.begin();
        int32_t fewest = INT32_MAX;
        for (auto it = pending_.begin(); it != pending_.end() && fewest > 0; ++it) {
            auto held = n_held_of_.find(it->id_owner);
            const int32_t n_owner = held == n_held_of_.end() ? 0 : held->second;
            if (n_owner < fewest) {
                fewest = n_owner;
                pick = it;
            }
        }
        n_held_of_[pick->id_owner] += 1;
        incoming.push_back(std::move(*pick));
        pending_.erase(pick);
        ln.n_held += 1;
    }
}

submit_result engine::submit_embedding(int64_t id_request, int64_t id_owner,
                                       std::vector<std::vector<int32_t>> inputs) {
    if (!params_.embeddings) {
        throw std::invalid_argument("this is not an embedding model");
    }
    const submit_result admitted = enter_queue(id_owner);
    if (admitted != SUBMIT_ACCEPTED) {
        return admitted;
    }
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        lanes_.front()->tasks.push_back({task::TASK_EMBED, id_request, id_owner, nullptr, nullptr, std::move(inputs)});
    }
    cv_.notify_all();
    return SUBMIT_ACCEPTED;
}

void engine::cancel(int64_t id_request) {
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        for (task & t : pending_) {     // not in a lane yet: the lane that takes it cancels it
            if (t.id_request == id_request) {
                t.cancelled = true;
            }
        }
        for (auto & ln : lanes_) {      // the lane that holds it acts; the others find nothing
            ln->tasks.push_back({task::TASK_CANCEL, id_request, 0, nullptr, nullptr, {}});
        }
    }
    cv_.notify_all();
}

void engine::drain_event_fd() {
    uint64_t counter;
    while (read(efd_, &counter, sizeof(counter)) > 0) {
    }
}

std::vector<engine_event> engine::take_events() {
    drain_event_fd();
    std::vector<engine_event> out;
    std::lock_guard<std::mutex> lock(mu_events_);
    out.swap(events_);
    return out;
}

engine_stats engine::stats() const {
    engine_stats s = obs_.counters();
    std::lock_guard<std::mutex> lock(mu_stats_);
    s += stats_;
    s.n_tp_gather_full = tp_->n_gather_full();
    s.n_tp_gather_candidates = tp_->n_gather_candidates();
    return s;
}

std::vector<int32_t> engine::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    return tokenize_text(vocab_, text, add_special, parse_special);
}

std::string engine::meta(const std::string & key) const {
    return model_meta(model_, key);
}

std::string engine::chat_template() const {
    return model_chat_template(model_);
}

std::string engine::description() const {
    return model_description(model_);
}

// ---- the scheduler thread ------------------------------------------------------------------

void engine::loop(lane & ln) {
    std::vector<task> incoming;
    while (true) {
        {
            std::unique_lock<std::mutex> lock(mu_tasks_);
            auto ready = [&] {
                return stop_ || !ln.tasks.empty() || !ln.sched.idle() || (ln.index == 0 && !embed_jobs_.empty()) ||
                       n_to_take(ln) > 0;
            };
            // A tensor-parallel leader with nothing to do tells its followers it is there: a
            // follower lost between requests is found then, not at the next request's step.
            if (tp_->leader() && !cv_.wait_for(lock, std::chrono::milliseconds(lockstep::kKeepaliveMs), ready)) {
                lock.unlock();
                tp_->keepalive();
                continue;
            }
            cv_.wait(lock, ready);
            if (stop_) {
                return;
            }
            incoming.swap(ln.tasks);
            take_pending(ln, incoming);
        }
        // Nothing may leave this thread as an exception: std::terminate would end the whole
        // process. The per-request boundary is in sample_guarded(); this one is the last resort.
        try {
            apply_compute_scale(ln);
            take_tasks(ln, incoming);
            incoming.clear();
            if (params_.embeddings) {
                step_embed(ln);
            } else {
                step_generate(ln);
            }
        } catch (const std::exception & e) {
            incoming.clear();
            fail_everything(ln, std::string("engine error: ") + e.what());
        } catch (...) {
            incoming.clear();
            fail_everything(ln, "engine error");
        }
        const int32_t n_queued = [&] { std::lock_guard<std::mutex> lock(mu_tasks_); return n_queued_; }();
        obs_.after_step(ln.index, ln.sched, n_queued, (int32_t) embed_jobs_.size());
        flush_events(ln);
    }
}

void engine::take_tasks(lane & ln, std::vector<task> & incoming) {
    std::vector<engine_event> events;
    for (task & t : incoming) {
        if (t.kind == task::TASK_CANCEL) {
            if (!ln.sched.cancel(t.id_request) && ln.index == 0) {
                cancel_embedding(t.id_request, events);   // or finished already: nothing to do
            }
            continue;
        }
        if (t.kind == task::TASK_EMBED) {
            obs_.queued(t.id_request, t.t_submit_us, n_tokens_of(t.inputs));
            embed_jobs_.push_back({t.id_request, t.id_owner, std::move(t.inputs), {}, 0, 0});
            continue;
        }
        if (tp_->lost()) {             // the group is gone: no request can run here any more
            leave_queue_and_engine(t.id_owner);
            release_held(ln, t.id_owner);
            events.push_back(failed_event(t.id_request, tensor_lost()));
            continue;
        }
        auto req = std::make_unique<sched_request>();
        req->id_request = t.id_request;
        req->id_owner = t.id_owner;
        req->prompt = t.request->prompt;
        req->limits.n_max_tokens = t.request->max_tokens;
        req->may_draft = t.request->sampling.speculative;
        text_stream stream(t.request->stop);
        live_request live{std::move(t.request), std::move(t.sampler), std::move(stream),
                          (int32_t) req->prompt.size()};
        live.candidates = candidates_needed(live.request->sampling, (int32_t) eog_tokens_.size());
        const int64_t id = t.id_request;
        if (!ln.sched.enqueue(std::move(req))) {
            leave_queue_and_engine(t.id_owner);
            release_held(ln, t.id_owner);
            engine_event ev;
            ev.id_request = id;
            ev.status = REQUEST_STATUS_FINISHED_ERROR;
            ev.error = "the request could not be queued (empty prompt or full queue)";
            obs_.finished(id, ev.status);
            events.push_back(std::move(ev));
            continue;
        }
        obs_.queued(id, t.t_submit_us, live.n_prompt);
        ln.live.emplace(id, std::move(live));
        if (t.cancelled) {
            ln.sched.cancel(id);
        }
    }
    publish(ln, events);
}

// An embedding job is dropped between batches: an abandoned request stops costing anything.
void engine::cancel_embedding(int64_t id_request, std::vector<engine_event> & events) {
    for (auto it = embed_jobs_.begin(); it != embed_jobs_.end(); ++it) {
        if (it->id_request == id_request) {
            leave_queue_and_engine(it->id_owner);
            engine_event ev;
            ev.id_request = id_request;
            ev.status = REQUEST_STATUS_FINISHED_ABORTED;
            ev.timings = obs_.finished(id_request, ev.status);
            events.push_back(std::move(ev));
            embed_jobs_.erase(it);
            return;
        }
    }
}

void engine::step_generate(lane & ln) {
    engine_stats delta;
    uint64_t t0 = now_us();
    batch_plan plan = ln.sched.schedule();
    std::vector<engine_event> events;

    for (const plan_admission & adm : plan.admissions) {
        if (!ln.sched.find(adm.id_request)->preempted) {   // a resumed one was counted already
            leave_queue();
            obs_.admitted(adm);
        }
        tp_->seq_rm(ln.ctx, adm.id_slot, adm.n_keep, -1);
    }
    for (const plan_admission & adm : plan.admissions) {
        const int32_t rc = recompute_prefix(ln, adm);
        if (rc != 0) {
            publish(ln, events);
            fail_plan(ln, plan, decode_error(rc, ""));
            return;
        }
    }
    for (int64_t id : plan.released_waiting) {
        if (!ln.sched.find(id)->preempted) {
            leave_queue();
        }
    }
    for (int64_t id : plan.released) {                 // cancelled: a last event, then forget
        engine_event ev;
        ev.id_request = id;
        ev.status = REQUEST_STATUS_FINISHED_ABORTED;
        ev.timings = obs_.finished(id, ev.status);
        events.push_back(std::move(ev));
        forget(ln, id);
    }
    uint64_t t1 = now_us();
    delta.t_schedule_us = t1 - t0;

    if (plan.empty()) {
        publish(ln, events);
        return;
    }
    std::vector<int32_t> logit_index, prompt_rows_at;
    decode_plan(ln, plan, logit_index, prompt_rows_at);
    const uint32_t gather = tp_->active() ? gather_for(ln, plan) : 0;
    uint64_t t2 = now_us();
    delta.t_batch_us = t2 - t1;
    int32_t rc = -1;
    std::string failure;
    try {
        rc = decode(ln, gather);
    } catch (const std::exception & e) {
        failure = e.what();
    }
    uint64_t t3 = now_us();
    delta.t_decode_us = t3 - t2;
    if (rc != 0) {
        publish(ln, events);
        fail_plan(ln, plan, decode_error(rc, failure));
        return;
    }

    for (size_t i = 0; i < plan.items.size(); ++i) {   // before the first sample takes them
        if (prompt_rows_at[i] >= 0) {
            const plan_item & item = plan.items[i];
            take_prompt_rows(ln, ln.live.at(item.id_request), ln.sched.find(item.id_request)->prompt,
                             item.pos0, item.n_tokens, prompt_rows_at[i]);
        }
    }
    std::vector<step_outcome> outcomes;
    std::vector<int64_t> sample_us(plan.items.size(), 0);
    uint64_t t_item = t3;
    for (size_t i = 0; i < plan.items.size(); ++i) {
        const plan_item & item = plan.items[i];
        if (!item.want_logits) {
            continue;
        }
        engine_event ev;
        outcomes.push_back(item.n_draft > 0 ? sample_drafted(ln, item, logit_index[i], ev)
                                            : sample_guarded(ln, item.id_request, logit_index[i], ev));
        delta.n_draft_tokens += item.n_draft;
        delta.n_draft_accepted_tokens += outcomes.back().n_accepted;
        events.push_back(std::move(ev));
        const uint64_t t_sampled = now_us();
        sample_us[i] = (int64_t) (t_sampled - t_item);
        t_item = t_sampled;
    }
    uint64_t t4 = t_item;
    delta.t_sample_us = t4 - t3;
    ln.sched.charge(plan, (int64_t) delta.t_decode_us, sample_us);

    const std::vector<int64_t> finished = ln.sched.apply(plan, outcomes);
    finish_events(ln, finished, events);
    publish(ln, events);
    uint64_t t5 = now_us();
    delta.t_emit_us = t5 - t4;
    delta.n_steps = 1;
    delta.n_tokens_decoded = plan.n_tokens;
    delta.n_tokens_sampled = outcomes.size() + delta.n_draft_accepted_tokens;
    obs_.step(plan, t0, delta);
    std::lock_guard<std::mutex> lock(mu_stats_);
    stats_ += delta;
}

void engine::set_compute_scale(float scale) {
    compute_scale_ = std::min(1.0f, std::max(0.0f, scale));
    cv_.notify_all();
}

// On the engine thread, between steps: llama.cpp takes a new thread count for the next decode.
void engine::apply_compute_scale(lane & ln) {
    const float scale = compute_scale_.load();
    if (scale == ln.compute_scale_applied) {
        return;
    }
    ln.compute_scale_applied = scale;
    const int32_t n_threads = std::max(1, (int32_t) std::lround(n_threads_full_ * scale));
    llama_set_n_threads(ln.ctx, n_threads, n_threads);
    ln.sched.set_active_slots(scale >= 1.0f ? 0 : std::max(1, (int32_t) std::lround(ln.n_slots * scale)));
}

// Every output row of the step is sampled (sample(), sample_drafted(): a draft's rows each as
// without the draft) or read for log-probabilities (those requests need whole rows), so the
// step's rows can come as candidates when every request with a row allows it.
uint32_t engine::gather_for(const lane & ln, const batch_plan & plan) const {
    if (tp_full_rows_) {
        return 0;
    }
    int32_t most = 0;
    for (const plan_item & item : plan.items) {
        const live_request & live = ln.live.at(item.id_request);
        const bool rows = item.want_logits || (item.is_prompt && live.wants_prompt_rows());
        if (!rows) {
            continue;
        }
        if (live.candidates < 0 || live.candidates > (int32_t) lockstep_wire::kMaxGather) {
            return 0;
        }
        most = std::max(most, live.candidates);
    }
    return (uint32_t) most;
}

int32_t engine::decode(lane & ln, uint32_t gather) {
    if (n_fail_decodes_.load(std::memory_order_relaxed) > 0) {
        n_fail_decodes_.fetch_sub(1);
        return -3;                     // what llama_decode answers when it aborts a batch
    }
    int32_t rc;
    {
        // One lane at a time submits: ggml's RPC client keeps per device the last graph sent,
        // and a lane that found its own there would ask the server to run "the last graph"
        // again while the other lane's replaced it. What runs in here is this node's layers
        // and the queueing of the rest; the other lanes' steps on other nodes go on meanwhile.
        std::lock_guard<std::mutex> submitting(mu_decode_);
        rc = tp_->decode(ln.ctx, ln.batch, gather);
    }
    // Wait for the step here, not in the first logits read. The RPC backend has one queue per
    // server for every context of the model, and a wait is a marker queued behind all that is
    // there: a lane that waited later would wait for the other lane's step, queued meanwhile.
    llama_synchronize(ln.ctx);
    return rc;
}

// Why a plan's decode failed: the tensor group's loss first (every node's step failed with it).
std::string engine::decode_error(int32_t rc, const std::string & failure) const {
    if (tp_->lost()) {
        return tensor_lost();
    }
    return rc == 1 ? "no room left in the KV cache" : "llama_decode failed" + (failure.empty() ? "" : ": " + failure);
}

std::string engine::tensor_lost() const {
    return tp_ && tp_->lost() ? "the tensor-parallel group was lost (a node holding part of the model is gone): " +
                                    tp_->lost_reason()
                              : "";
}

std::string engine::follow() {
    if (params_.tp_rank <= 0) {
        throw std::logic_error("only a tensor-parallel follower (tp_rank > 0) follows");
    }
    std::lock_guard<std::mutex> following(mu_follow_);
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        if (stop_) {
            return "closed";
        }
    }
    lane & ln = *lanes_.front();
    const control_limits limits{(int32_t) llama_n_batch(ln.ctx), (int32_t) llama_n_seq_max(ln.ctx), n_vocab(),
                                params_.context_length};
    return tp_->follow(ln.ctx, ln.batch, limits, follow_stop_, [this](int32_t n_tokens, uint64_t us) {
        std::lock_guard<std::mutex> lock(mu_stats_);
        stats_.n_steps += 1;
        stats_.n_tokens_decoded += n_tokens;
        stats_.t_decode_us += us;
    });
}

void engine::decode_plan(lane & ln, const batch_plan & plan, std::vector<int32_t> & logit_index,
                         std::vector<int32_t> & prompt_rows_at) {
    llama_batch & batch = ln.batch;
    batch.n_tokens = 0;
    logit_index.assign(plan.items.size(), -1);
    prompt_rows_at.assign(plan.items.size(), -1);
    for (size_t i = 0; i < plan.items.size(); ++i) {
        const plan_item & item = plan.items[i];
        const sched_request * req = ln.sched.find(item.id_request);
        // a drafted item samples at every position: its rows start at its first token
        const int32_t first_sampled = item.n_draft > 0 ? batch.n_tokens : batch.n_tokens + item.n_tokens - 1;
        // a prompt chunk whose log-probabilities were asked for: a row at every token, in the
        // prefill the request does anyway
        const bool every_row = item.is_prompt && ln.live.at(item.id_request).wants_prompt_rows();
        if (every_row) {
            prompt_rows_at[i] = batch.n_tokens;
        }
        for (int32_t k = 0; k < item.n_tokens; ++k) {
            const int32_t token = item.is_prompt ? req->prompt[item.pos0 + k]
                                : k == 0         ? req->last_token
                                                 : req->draft[k - 1];
            const bool last = k == item.n_tokens - 1;
            batch_add(batch, token, item.pos0 + k, item.id_slot,
                      every_row || (item.want_logits && (last || item.n_draft > 0)));
        }
        if (item.want_logits) {
            logit_index[i] = first_sampled;
        }
    }
}

// A request that wants its prompt's log-probabilities was admitted into a slot whose cache
// holds part of its prompt: those tokens are decoded again (their KV replaced), in batches of
// the context's size, since their logits were never kept. vLLM skips the prefix cache for such
// a request the same way. What a preempted request found already is not computed twice.
// Returns llama_decode's code (0: done).
int32_t engine::recompute_prefix(lane & ln, const plan_admission & adm) {
    live_request & live = ln.live.at(adm.id_request);
    if (!live.wants_prompt_rows()) {
        return 0;
    }
    const int32_t from = (int32_t) live.prompt_rows.size();   // the next position whose row is missing
    if (from >= adm.n_keep) {
        return 0;
    }
    sched_request * req = ln.sched.find(adm.id_request);
    if (!req->preempted) {
        req->n_cached = from;              // decoded again: not read from the cache
    }
    tp_->seq_rm(ln.ctx, adm.id_slot, from, -1);
    const int32_t n_batch = (int32_t) llama_n_batch(ln.ctx);
    for (int32_t pos = from; pos < adm.n_keep;) {
        const int32_t n = std::min(n_batch, adm.n_keep - pos);
        ln.batch.n_tokens = 0;
        for (int32_t k = 0; k < n; ++k) {
            batch_add(ln.batch, req->prompt[pos + k], pos + k, adm.id_slot, true);
        }
        const int32_t rc = decode(ln);
        if (rc != 0) {
            return rc;
        }
        take_prompt_rows(ln, live, req->prompt, pos, n, 0);
        pos += n;
    }
    return 0;
}

// Prompt token k + 1's log-probability comes from the logits at position k; the chunk at
// [pos0, pos0 + n_tokens) has its rows from batch row `first` on. The last prompt token's row
// is the first sample's.
// The rows go over the lane's threads (idle between two decodes): a row is a few passes over
// the vocabulary, and a chunk has up to a batch of them.
void engine::take_prompt_rows(lane & ln, live_request & live, const std::vector<int32_t> & prompt,
                              int32_t pos0, int32_t n_tokens, int32_t first) {
    const int32_t n_top = live.request->sampling.n_top_logprobs;
    const int32_t n_have = (int32_t) live.prompt_rows.size();
    // positions pos0 + k from k_from on are new (rows before were found earlier); the last
    // prompt token's row is the first sample's
    const int32_t k_from = std::max(0, n_have - pos0);
    const int32_t k_to = std::min(n_tokens, (int32_t) prompt.size() - 1 - pos0);
    if (pos0 > n_have || k_from >= k_to) {
        return;
    }
    std::vector<const float *> logits(k_to - k_from);
    for (int32_t k = k_from; k < k_to; ++k) {
        logits[k - k_from] = llama_get_logits_ith(ln.ctx, first + k);   // not thread-safe: here
    }
    std::vector<logprob_entry> & out = live.prompt_rows;
    out.resize(n_have + (k_to - k_from));
    auto work = [&](int32_t from, int32_t to) {
        for (int32_t k = from; k < to; ++k) {
            out[n_have + k - k_from] = logprob_entry_of(logits[k - k_from], prompt[pos0 + k + 1], n_top);
        }
    };
    const int32_t n_rows = k_to - k_from;
    const int32_t n_threads = std::max(1, std::min(n_threads_full_, n_rows / 16));
    std::vector<std::thread> helpers;
    const int32_t per = (n_rows + n_threads - 1) / n_threads;
    for (int32_t t = 1; t < n_threads; ++t) {
        helpers.emplace_back(work, k_from + t * per, std::min(k_to, k_from + (t + 1) * per));
    }
    work(k_from, std::min(k_to, k_from + per));
    for (std::thread & helper : helpers) {
        helper.join();
    }
}

logprob_entry engine::logprob_entry_of(const float * logits, int32_t token, int32_t n_top) const {
    const logit_stats stats = logit_stats_of(logits, llama_vocab_n_tokens(vocab_), n_top);
    logprob_entry entry{{token, logits[token] - stats.log_sum_exp, token_piece(vocab_, token)}, {}};
    entry.top.reserve(stats.top.size());
    for (const auto & [t, logit] : stats.top) {
        entry.top.push_back({t, logit - stats.log_sum_exp, token_piece(vocab_, t)});
    }
    return entry;
}

// One request's failure in sampling (a grammar that throws, a bad state in llama.cpp) ends
// that request with an error event; the others in the batch go on.
step_outcome engine::sample_guarded(lane & ln, int64_t id_request, int32_t index, engine_event & ev,
                                    int32_t n_before) {
    try {
        return sample(ln, id_request, index, ev, n_before);
    } catch (const std::exception & e) {
        ev.error = std::string("sampling failed: ") + e.what();
    } catch (...) {
        ev.error = "sampling failed";
    }
    ev.id_request = id_request;
    ev.text.clear();
    ev.logprobs.clear();
    return {id_request, -1, REQUEST_STATUS_FINISHED_ERROR};
}

// Verifies a draft: samples position after position, each exactly as without the draft (the
// same sampler, RNG draws, grammar, penalties, stop strings and limits, in the same order),
// while the sample is the drafted token. For greedy that is "accept while the argmax is the
// draft". For temperature > 0 it is the speculative-sampling rule with a point-mass draft: the
// draft x is kept with probability p(x), and otherwise the token drawn is distributed as p with
// x removed and renormalised, so every token is distributed as without drafting. The KV cells
// of the drafted tokens after the last accepted one are removed; the samples go out as one event.
step_outcome engine::sample_drafted(lane & ln, const plan_item & item, int32_t index, engine_event & ev) {
    const std::vector<token_t> & draft = ln.sched.find(item.id_request)->draft;
    step_outcome out{};
    for (int32_t j = 0; j <= item.n_draft; ++j) {
        engine_event one;
        out = sample_guarded(ln, item.id_request, index + j, one, j);
        out.n_accepted = j;
        if (j == 0) {
            ev = std::move(one);
        } else {
            ev.text += one.text;
            ev.n_tokens += one.n_tokens;
            ev.n_generated = one.n_generated;
            ev.error = one.error;
            for (auto & entry : one.logprobs) {
                ev.logprobs.push_back(std::move(entry));
            }
        }
        if (request_status_is_finished(out.status) || j == item.n_draft || out.token != draft[j]) {
            break;
        }
    }
    if (out.n_accepted < item.n_draft) {
        tp_->seq_rm(ln.ctx, item.id_slot, item.pos0 + 1 + out.n_accepted, -1);
    }
    obs_.drafted(item.id_request, item.n_draft, out.n_accepted);
    return out;
}

// Sample the next token of one request from output row `index`, and describe it in `ev`;
// `n_before` tokens of the request were sampled earlier in this step (a draft's verification).
step_outcome engine::sample(lane & ln, int64_t id_request, int32_t index, engine_event & ev, int32_t n_before) {
    live_request & live = ln.live.at(id_request);
    const sched_request & req = *ln.sched.find(id_request);
    const sampling_params & sp = live.request->sampling;
    const float * logits = llama_get_logits_ith(ln.ctx, index);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab_);

    logit_stats stats{};
    if (sp.logprobs) {
        stats = logit_stats_of(logits, n_vocab, sp.n_top_logprobs);
    }
    const int32_t n_generated = req.n_generated + n_before;
    const bool suppress_eog = sp.ignore_eos || n_generated < sp.min_tokens;
    const int32_t token = live.sampler->sample(logits, n_vocab, suppress_eog, eog_tokens_);
    obs_.token(id_request);

    ev.id_request = id_request;
    ev.n_tokens = 1;
    ev.n_prompt = live.n_prompt;
    if (live.wants_prompt_rows()) {        // the prompt's rows go out with the first sample
        ev.prompt_logprobs = std::move(live.prompt_rows);
        live.prompt_rows.clear();
        live.prompt_rows_sent = true;
    }
    ev.n_cached = req.n_cached;
    ev.n_generated = n_generated + 1;
    if (token == LLAMA_TOKEN_NULL) {
        ev.n_tokens = 0;
        ev.n_generated = n_generated;
        ev.error = "the response format's grammar allows no further token";
        return {id_request, -1, REQUEST_STATUS_FINISHED_ERROR};
    }
    live.sampler->accept(token);
    request_status status = REQUEST_STATUS_RUNNING;
    const std::string piece = token_piece(vocab_, token);   // an end token's is empty: not text
    if (llama_vocab_is_eog(vocab_, token)) {
        status = REQUEST_STATUS_FINISHED_STOPPED;
    } else {
        ev.text = live.stream.push(piece);
        if (live.stream.stopped()) {
            status = REQUEST_STATUS_FINISHED_STOPPED;
        }
    }
    // The end token has its log-probability too (as vLLM and OpenAI list it): a harness that
    // scores a prompt by echo with one generated token counts on that last entry being there.
    if (sp.logprobs) {
        logprob_entry entry{{token, logits[token] - stats.log_sum_exp, piece}, {}};
        for (const auto & [t, logit] : stats.top) {
            entry.top.push_back({t, logit - stats.log_sum_exp, token_piece(vocab_, t)});
        }
        ev.logprobs.push_back(std::move(entry));
    }
    return {id_request, token, status};
}

// The last event of each finished request carries its status and any text held back.
void engine::finish_events(lane & ln, const std::vector<int64_t> & finished, std::vector<engine_event> & events) {
    for (int64_t id : finished) {
        const sched_request * req = ln.sched.find(id);
        live_request & live = ln.live.at(id);
        for (auto it = events.rbegin(); it != events.rend(); ++it) {
            if (it->id_request == id) {
                it->status = req->status;
                it->timings = obs_.finished(id, req->status);
                it->text += live.stream.flush();
                it->stop = live.stream.matched();
                break;
            }
        }
        forget(ln, id);
    }
}

void engine::forget(lane & ln, int64_t id_request) {
    auto it = ln.live.find(id_request);
    if (it != ln.live.end()) {
        leave_engine(it->second.request->id_owner);
        release_held(ln, it->second.request->id_owner);
        ln.live.erase(it);
    }
    ln.sched.release(id_request);
}

// Requests of a lane are over: with several lanes, its room for queued ones grows.
void engine::release_held(lane & ln, int64_t id_owner) {
    if (lanes_.size() == 1) {
        return;                        // one lane takes everything at once (submit)
    }
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        ln.n_held -= 1;
        auto held = n_held_of_.find(id_owner);
        if (held != n_held_of_.end() && --held->second <= 0) {
            n_held_of_.erase(held);
        }
    }
    cv_.notify_all();                  // another lane may now take its share
}

// The decode of a plan failed. Its requests end with an error and their sequences are cleared,
// in the KV cache and in the scheduler's view alike, so prefix reuse never trusts cells that
// no longer hold what it thinks. llama.cpp leaves the sequences outside the batch untouched.
void engine::fail_plan(lane & ln, const batch_plan & plan, const std::string & error) {
    std::vector<engine_event> events;
    for (const plan_item & item : plan.items) {
        if (ln.live.count(item.id_request) == 0) {
            continue;                  // several items of one request: handled at the first
        }
        events.push_back(failed_event(item.id_request, error));
        tp_->seq_rm(ln.ctx, item.id_slot, -1, -1);
        ln.sched.fail(item.id_request);
        forget(ln, item.id_request);
    }
    publish(ln, events);
}

// The last event of a request that ends in an error, with where its time went.
engine_event engine::failed_event(int64_t id_request, const std::string & error) {
    engine_event ev;
    ev.id_request = id_request;
    ev.status = REQUEST_STATUS_FINISHED_ERROR;
    ev.error = error;
    ev.timings = obs_.finished(id_request, ev.status);
    return ev;
}

// The last resort of the engine thread: every request ends with an error, the scheduler and
// the KV cache start over empty, and the engine goes on serving new requests.
void engine::fail_everything(lane & ln, const std::string & error) {
    std::vector<engine_event> events;
    for (auto & [id, live] : ln.live) {
        const sched_request * req = ln.sched.find(id);
        if (req != nullptr && req->status == REQUEST_STATUS_WAITING && !req->preempted) {
            leave_queue();
        }
        leave_engine(live.request->id_owner);
        events.push_back(failed_event(id, error));
    }
    for (const embed_job & job : embed_jobs_) {   // lane 0's, and only an embedding model's
        leave_queue_and_engine(job.id_owner);
        events.push_back(failed_event(job.id_request, error));
    }
    for (const auto & [id, live] : ln.live) {
        release_held(ln, live.request->id_owner);
    }
    ln.live.clear();
    if (ln.index == 0) {
        embed_jobs_.clear();
    }
    ln.sched = scheduler(scheduler_params_of(params_, ln.index));
    ln.compute_scale_applied = 1.0f;   // the new scheduler admits every slot: apply the scale again
    tp_->clear(ln.ctx);
    publish(ln, events);
}

// ---- embeddings ----------------------------------------------------------------------------

// Whole inputs go into one batch: first one input of every job, oldest first, so a small
// request is never stuck behind a large one; then as many more as fit, oldest job first.
void engine::step_embed(lane & ln) {
    if (embed_jobs_.empty()) {
        return;
    }
    const int32_t n_embd = llama_model_n_embd(model_);
    const int32_t n_cap = (int32_t) llama_n_batch(ln.ctx);
    const int32_t n_seq_cap = (int32_t) llama_n_seq_max(ln.ctx);

    struct placed { size_t job, input; int32_t seq; };
    std::vector<placed> placed_inputs;
    std::vector<size_t> next(embed_jobs_.size());
    ln.batch.n_tokens = 0;
    auto place = [&](size_t j) {
        const embed_job & job = embed_jobs_[j];
        if (next[j] >= job.inputs.size()) {
            return false;
        }
        const auto & tokens = job.inputs[next[j]];
        const int32_t seq = (int32_t) placed_inputs.size();
        if (ln.batch.n_tokens + (int32_t) tokens.size() > n_cap || seq >= n_seq_cap) {
            return false;
        }
        for (size_t k = 0; k < tokens.size(); ++k) {
            batch_add(ln.batch, tokens[k], (int32_t) k, seq, true);
        }
        placed_inputs.push_back({j, next[j], seq});
        next[j] += 1;
        return true;
    };
    for (size_t j = 0; j < embed_jobs_.size(); ++j) {
        next[j] = embed_jobs_[j].n_done;
        place(j);
    }
    for (size_t j = 0; j < embed_jobs_.size(); ++j) {
        while (place(j)) {
        }
    }

    std::vector<engine_event> events;
    if (placed_inputs.empty()) {                // an input longer than a batch: refuse its job
        events.push_back(failed_event(embed_jobs_.front().id_request,
                                      "input is longer than the model's context"));
        leave_queue_and_engine(embed_jobs_.front().id_owner);
        embed_jobs_.erase(embed_jobs_.begin());
        publish(ln, events);
        return;
    }
    tp_->clear(ln.ctx);
    const uint64_t t0 = now_us();
    const int32_t rc = decode(ln);
    const uint64_t t1 = now_us();
    for (const placed & p : placed_inputs) {
        embed_job & job = embed_jobs_[p.job];
        if (job.out.empty()) {
            job.out.assign(job.inputs.size() * n_embd, 0.0f);
        }
        const float * v = rc == 0 ? llama_get_embeddings_seq(ln.ctx, p.seq) : nullptr;
        if (v != nullptr) {
            double norm = 0.0;
            for (int32_t d = 0; d < n_embd; ++d) {
                norm += (double) v[d] * v[d];
            }
            const float scale = norm > 0.0 ? (float) (1.0 / std::sqrt(norm)) : 0.0f;
            for (int32_t d = 0; d < n_embd; ++d) {
                job.out[p.input * n_embd + d] = v[d] * scale;
            }
        }
        job.n_tokens += (int32_t) job.inputs[p.input].size();
    }
    std::vector<bool> finishing(embed_jobs_.size());
    for (size_t j = 0; j < embed_jobs_.size(); ++j) {
        embed_job & job = embed_jobs_[j];
        // A failed decode ends the jobs that were in it; the others wait for the next batch.
        finishing[j] = rc == 0 ? next[j] == job.inputs.size() : next[j] > job.n_done;
        job.n_done = next[j];
    }
    size_t j = 0;
    for (auto it = embed_jobs_.begin(); it != embed_jobs_.end(); ++j) {
        if (!finishing[j]) {
            ++it;
            continue;
        }
        engine_event ev;
        ev.id_request = it->id_request;
        ev.n_prompt = it->n_tokens;
        if (rc != 0) {
            ev.status = REQUEST_STATUS_FINISHED_ERROR;
            ev.error = "llama_decode failed";
        } else {
            ev.status = REQUEST_STATUS_FINISHED_STOPPED;
            ev.embedding = std::move(it->out);
        }
        ev.timings = obs_.finished(ev.id_request, ev.status);
        events.push_back(std::move(ev));
        leave_queue_and_engine(it->id_owner);
        it = embed_jobs_.erase(it);
    }
    publish(ln, events);
    std::lock_guard<std::mutex> lock(mu_stats_);
    stats_.n_steps += 1;
    stats_.n_tokens_decoded += ln.batch.n_tokens;
    stats_.t_decode_us += t1 - t0;
}

// Events wait on the engine thread until the end of the loop's turn (flush_events), so that a
// reader who sees a request's end also sees its counts: the observer commits them after the step.
void engine::publish(lane & ln, std::vector<engine_event> & events) {
    for (auto & ev : events) {
        ln.outgoing.push_back(std::move(ev));
    }
    events.clear();
}

void engine::flush_events(lane & ln) {
    std::vector<engine_event> & outgoing = ln.outgoing;
    if (outgoing.empty()) {
        return;
    }
    if (send_directly(ln)) {
        outgoing.clear();
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_events_);
        if (events_.empty()) {
            events_.swap(outgoing);
        } else {
            for (auto & ev : outgoing) {
                events_.push_back(std::move(ev));
            }
        }
    }
    outgoing.clear();
    signal_reader();
}

// A worker's step: its events straight to the daemon. Not when the reader holds events not yet
// relayed (they go first), and not for a step that ends a request: the reader follows an end
// with the engine's counts, so /metrics has a request once its client has its answer.
bool engine::send_directly(lane & ln) {
    std::lock_guard<std::mutex> lock(mu_events_);
    if (!sink_ || !events_.empty() || any_ends_a_request(ln.outgoing)) {
        return false;
    }
    if (sink_->write_events(ln.outgoing)) {
        signal_reader();               // bytes wait: the reader must watch for writable
    }
    return true;
}

bool engine::relay_events() {
    drain_event_fd();
    // Taken and written under one lock: a step cannot send between the two and overtake them.
    std::lock_guard<std::mutex> lock(mu_events_);
    if (events_.empty() || !sink_) {
        return false;
    }
    const bool any_finished = any_ends_a_request(events_);
    sink_->write_events(events_);
    events_.clear();
    return any_finished;
}

void engine::attach_sink(std::unique_ptr<event_sink> sink) {
    std::lock_guard<std::mutex> lock(mu_events_);
    sink_ = std::move(sink);
}

void engine::signal_reader() {
    const uint64_t one = 1;
    ssize_t written = write(efd_, &one, sizeof(one));
    (void) written;
}
