// The engine's core (engine.h): loading, the lanes, admission and the shared queue, submit and
// cancel, each lane's loop and its decode, and the events on their way out. A lane's step is
// in engine_generate.cpp or engine_embed.cpp, a tensor split's parts in engine_tensor_split.cpp.
#include "engine.h"

#include "model_facts.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <stdexcept>

namespace {

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
        make_prompt_cache(cp);
        if (pcache_ && params_.tp_rank > 0) {
            preload_prefixes(*lanes_[0]);   // a follower has no thread of its own (start_lanes)
        }
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
    // a warm-up of local models only: a split's step involves its other nodes, which its own start checks
    start_lanes(!params_.embeddings && params_.tp_rank < 0 && params_.placement.rpc_endpoints.empty());
}

// Each lane's thread warms its context up (`warm`) and, lane 0's, puts the prompt cache back
// before it serves; the constructor returns once every lane has, so the first request finds
// both done. Every graph of a lane then runs on that one thread. ggml's CPU backend computes a
// graph on an OpenMP team of the calling thread, and a warm-up on the constructing thread made
// a second team: libgomp, counting more of its threads than cores, then cut its spinning at
// barriers to a few hundred turns, so every node's barrier slept and was woken (~2,000 futex
// calls a step) and one stream decoded at an eighth of its speed on a quiet 2-core VM
// (bench/README.md, "What changed").
void engine::start_lanes(bool warm) {
    std::vector<std::future<void>> started;
    for (auto & ln : lanes_) {
        lane * mine = ln.get();
        auto ready = std::make_shared<std::promise<void>>();
        started.push_back(ready->get_future());
        ln->thread = std::thread([this, mine, ready, warm] {
            try {
                if (warm) {
                    warm_up(*mine);
                }
                if (pcache_ && mine->index == 0) {
                    preload_prefixes(*mine);
                }
            } catch (...) {
                ready->set_exception(std::current_exception());
                return;
            }
            ready->set_value();
            loop(*mine);
        });
    }
    for (auto & f : started) {
        try {
            f.get();
        } catch (...) {
            close();                   // the lanes that started stop; the model goes
            ::close(efd_);
            efd_ = -1;
            throw;
        }
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

// One decode of a single token before the first request, its KV then dropped, as llama-server's
// warm-up run: the first request after a load (a start, a swap, a worker's restart) no longer
// pays for ggml's graph and buffers, its threads' start and the first touch of the weights'
// pages, which cost it tens of milliseconds here. Local models only: a split's step involves
// its other nodes, which its own start checks. Nothing of it is counted.
void engine::warm_up(lane & ln) {
    llama_token token = llama_vocab_bos(vocab_);
    if (token == LLAMA_TOKEN_NULL) {
        token = 0;
    }
    llama_batch batch = llama_batch_init(1, 0, 1);
    batch.n_tokens = 1;
    batch.token[0] = token;
    batch.pos[0] = 0;
    batch.n_seq_id[0] = 1;
    batch.seq_id[0][0] = 0;
    batch.logits[0] = 1;
    llama_decode(ln.ctx, batch);      // a failure here is the first request's to report
    llama_memory_seq_rm(llama_get_memory(ln.ctx), 0, -1, -1);
    llama_batch_free(batch);
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
    if (pcache_) {
        pcache_->flush();              // its queued files written first
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

// One request is a request of one choice.
submit_result engine::submit(generation_request req) {
    std::vector<generation_request> one;
    one.push_back(std::move(req));
    return submit_all(std::move(one));
}

// Job i is refused when i places in the queue, or its owner's share, are all that was left:
// the queue's check first, as enter_queue() makes it.
size_t engine::n_with_room(const std::vector<generation_request> & reqs, submit_result & why) const {
    std::unordered_map<int64_t, int32_t> taken;   // owner -> places the jobs before this one took
    for (size_t i = 0; i < reqs.size(); ++i) {
        if (n_queued_ + (int32_t) i >= params_.max_queue) {
            why = SUBMIT_QUEUE_FULL;
            return i;
        }
        const int64_t owner = reqs[i].id_owner;
        auto held = n_owned_of_.find(owner);
        int32_t & mine = taken[owner];
        if ((held == n_owned_of_.end() ? 0 : held->second) + mine >= n_max_owned_) {
            why = SUBMIT_OVER_SHARE;
            return i;
        }
        mine += 1;
    }
    why = SUBMIT_ACCEPTED;
    return reqs.size();
}

submit_result engine::submit_all(std::vector<generation_request> reqs) {
    if (params_.embeddings) {
        throw std::invalid_argument("this is an embedding model: it does not generate");
    }
    if (params_.tp_rank > 0) {
        throw std::runtime_error("a tensor-parallel follower takes no requests: its leader's engine does");
    }
    submit_result why = SUBMIT_ACCEPTED;
    size_t n_room;
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        n_room = n_with_room(reqs, why);
    }
    // The samplers of the jobs that have room, outside the lock (parsing a grammar takes a
    // while): a bad one throws here, before anything is queued. A full queue parses nothing.
    std::vector<std::unique_ptr<request_sampler>> samplers;
    samplers.reserve(n_room);
    for (size_t i = 0; i < n_room; ++i) {
        samplers.push_back(std::make_unique<request_sampler>(reqs[i].sampling, vocab_));   // may throw: bad grammar
    }
    if (n_room < reqs.size()) {
        return why;
    }
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        if (n_with_room(reqs, why) < reqs.size()) {
            return why;                // the queue filled up while the samplers were made
        }
        for (size_t i = 0; i < reqs.size(); ++i) {
            const int64_t id = reqs[i].id_request, owner = reqs[i].id_owner;
            n_owned_of_[owner] += 1;
            n_queued_ += 1;
            task t{task::TASK_SUBMIT, id, owner, nullptr, std::move(samplers[i]), {}};
            t.request = std::make_unique<generation_request>(std::move(reqs[i]));
            if (lanes_.size() == 1) {
                lanes_.front()->tasks.push_back(std::move(t));
            } else {
                pending_.push_back(std::move(t));
            }
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
    if (pcache_) {
        const prompt_cache_counters & pc = pcache_->counters;
        s.n_prompt_cache_hits = pc.hits;
        s.n_prompt_cache_misses = pc.misses;
        s.n_prompt_cache_rejected = pc.rejected;
        s.n_prompt_cache_bytes_read = pc.bytes_read;
        s.n_prompt_cache_bytes_written = pc.bytes_written;
        s.n_prompt_cache_saves = pc.saves;
        s.n_prompt_cache_saves_skipped = pc.saves_skipped;
        s.n_prompt_cache_evictions = pc.evictions;
        s.n_prompt_cache_superseded = pc.superseded;
        s.n_prompt_cache_restored_tokens = pc.restored_tokens;
        s.t_prompt_cache_restore_us = pc.restore_us;
        s.n_prompt_cache_preloads = pc.preloads;
        s.n_prompt_cache_preloaded_tokens = pc.preloaded_tokens;
    }
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
