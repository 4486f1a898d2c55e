// The engine: one loaded model and its lanes. A lane is a context with its own slots, KV
// cache and scheduler, and a thread that runs continuous batching on it without ever touching
// Python. Callers post id-tagged tasks (submit, cancel); a lane's thread drains them between
// steps and publishes events, then signals an eventfd that the event loop watches. Embedding
// models run the same loop with a simpler step.
//
// One lane is the rule. A model whose layers are split over several nodes may ask for more
// (engine_params::n_lanes, the placement's options.lanes): a lane's step runs on the nodes one
// after another, so while one lane's step is on a follower, the next lane's runs on the leader
// (pipeline parallelism with whole steps as the micro-batches). New requests then wait in one
// queue, and lanes take them while they have free slots, each its even share of what all hold
// and wait for: two requests go to two lanes, and no request waits behind a busy lane while
// another has room. The queue is taken owner by owner, the one holding fewest slots over all
// lanes first, so one key's flood never stands between another key and a free slot. Lanes
// share only the model, that queue, the observer and the outgoing events, each under its lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "counters.h"
#include "devices.h"
#include "engine_event.h"
#include "event_sink.h"
#include "llama.h"
#include "lockstep.h"
#include "observer.h"
#include "prompt_cache.h"
#include "sampling.h"
#include "scheduler.h"
#include "text_stream.h"

// The daemon's settings keep their names here, from the config through Engine(...) to C++:
// slots, context_length, batch, threads, max_queue, flash_attn and kv_type are engine.<name>, key_share
// is inference.limits.key_share. The rest are the model's or its placement's, not settings.
struct engine_params {
    std::string model_path;
    bool        embeddings     = false;  // an embedding model: pooled vectors, no sampling
    int32_t     slots          = 4;      // sequences decoded together
    int32_t     context_length = 2048;   // context of one sequence (prompt + output)
    int32_t     batch          = 512;    // tokens per decode step at most
    int32_t     n_ubatch       = 0;      // tokens per micro-batch (0: the step, up to 512); smaller
                                         // lets pipeline-parallel devices overlap within a step
    int32_t     threads        = 0;      // 0: all cores
    int32_t     max_queue      = 256;    // queued requests beyond which submit() refuses
    int32_t     flash_attn     = -1;     // llama_flash_attn_type: -1 auto, 0 off, 1 on
    int32_t     kv_type        = GGML_TYPE_F16;  // ggml_type of the KV cache's K and V (kv_type):
                                         // F16 or Q8_0; a quantized V needs flash attention
    float       key_share      = 1.0f;   // most of the slots and of the queue one owner may hold
    int32_t     n_lanes        = 1;      // contexts stepping in turn (slots shared out among them):
                                         // for a layer split over several nodes
    int32_t     speculative_draft_max = 8;     // drafted tokens per sequence and step (0: no
                                               // drafting; engine.speculative off)
    int32_t     speculative_step_tokens = 16;  // a step's tokens that drafts may fill up to
    bool        quiet          = true;   // silence llama.cpp's own logging
    placement_params placement;          // empty: every layer on this CPU
    // Tensor parallelism (lockstep.h): this engine's rank in its group of tp_size nodes, each on
    // its shard; -1 off. Rank 0 schedules and samples, ranks > 0 only follow(). One lane, no
    // embeddings. tp_transport: "" the kernels' library (stackd_tp_*), "memory:<name>" tests.
    int32_t     tp_rank        = -1;
    int32_t     tp_size        = 0;
    std::string tp_transport;
    // The prompt cache on disk (prompt_cache.h): this model's directory ("" off), the directory
    // of every model's (the budget's), what the KV depends on beyond what the engine knows (the
    // model's digest, the kernels), the shortest prefix saved, the budget in bytes (0 off), the
    // free disk a save leaves, and how many of the most recently used files a load puts back
    // into idle slots (preload_prefixes). Off for embeddings, tensor and layer splits, several lanes.
    std::string prompt_cache_dir;
    std::string prompt_cache_root;
    std::string prompt_cache_key;
    int32_t     prompt_cache_min_tokens = 512;
    int64_t     prompt_cache_bytes = 0;
    int64_t     prompt_cache_disk_reserve = 0;
    int32_t     prompt_cache_preload = 0;
};

struct generation_request {
    int64_t                  id_request = 0;
    int64_t                  id_owner   = 0;     // the API key that asked: the unit of fair share
    std::vector<int32_t>     prompt;
    int32_t                  max_tokens = 16;
    std::vector<std::string> stop;
    sampling_params          sampling;
};

// Why submit() did or did not take a request.
enum submit_result : int32_t {
    SUBMIT_ACCEPTED   = 0,
    SUBMIT_QUEUE_FULL = 1,   // the model's queue is full
    SUBMIT_OVER_SHARE = 2,   // this owner already holds its share of the queue
};

class engine {
public:
    explicit engine(const engine_params & params);
    ~engine();
    engine(const engine &) = delete;
    engine & operator=(const engine &) = delete;

    // Thread-safe. Throws std::invalid_argument on a bad grammar.
    submit_result submit(generation_request req);
    // A request's choices, every one or none (thread-safe): they take their places in the queue
    // and in their owner's share under one hold of mu_tasks_, so no other submit comes between
    // them and a refused request never leaves some of its choices running. SUBMIT_ACCEPTED with
    // every one queued, else what the first refused one would get from submit() after the ones
    // before it, with none queued (nothing to cancel). Throws std::invalid_argument, none queued,
    // when a grammar before the first refused one is bad (as submit() one after another would).
    submit_result submit_all(std::vector<generation_request> reqs);
    submit_result submit_embedding(int64_t id_request, int64_t id_owner,
                                   std::vector<std::vector<int32_t>> inputs);
    void cancel(int64_t id_request);
    // Throttle to a share of full compute (a power contract): threads and admitted slots in
    // proportion, never below one of each (per lane). Applied between steps.
    void set_compute_scale(float scale);
    // For the fault-injection tests only, never for serving: make the next `n` decode calls
    // fail as llama_decode can (no KV room, abort).
    void fail_next_decodes(int32_t n) { n_fail_decodes_ = n; }
    // For tests and benches only: a tensor split's steps gather the logits rows whole, never as
    // candidates (the path before candidates). Set before the first submit.
    void set_tp_full_rows(bool on) { tp_full_rows_ = on; }
    std::vector<engine_event> take_events();
    void close();

    // Where events go as they are made (event_sink.h): in an engine worker, its socket to the
    // daemon. Once attached, a step whose events end no request is written to the sink from
    // the engine thread itself, with no wake-up of the event fd's reader, provided nothing is
    // queued before it; everything else goes the usual way (events kept, event fd signalled)
    // and the reader relays it with relay_events(), so the stream stays in step order. Attach
    // before the first submit.
    void attach_sink(std::unique_ptr<event_sink> sink);
    event_sink * sink() { return sink_.get(); }
    // The reader's half: takes the kept events and writes them to the sink as one unit.
    // Returns whether any of them ends a request.
    bool relay_events();

    int event_fd() const { return efd_; }
    engine_stats stats() const;
    // Returns once the prompt cache's queued files are written (tests).
    void flush_prompt_cache() { if (pcache_) pcache_->flush(); }
    engine_observer & observer() { return obs_; }   // histograms, gauges, the trace

    // The model, for callers (thread-safe: read-only after load).
    std::vector<int32_t> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string          piece(int32_t token, bool special = false) const { return token_piece(vocab_, token, special); }
    std::string          meta(const std::string & key) const;
    std::string          chat_template() const;
    int32_t              n_ctx_train() const { return llama_model_n_ctx_train(model_); }
    int32_t              n_embd() const { return llama_model_n_embd(model_); }
    int32_t              n_vocab() const { return llama_vocab_n_tokens(vocab_); }
    uint64_t             n_params() const { return llama_model_n_params(model_); }
    uint64_t             model_size() const { return llama_model_size(model_); }
    std::string          description() const;
    int32_t              token_bos() const { return llama_vocab_bos(vocab_); }
    int32_t              token_eos() const { return llama_vocab_eos(vocab_); }
    const engine_params & params() const { return params_; }
    int32_t              n_lanes() const { return (int32_t) lanes_.size(); }

    // Tensor parallelism. A follower (tp_rank > 0) takes no requests: it mirrors the leader's
    // decodes and KV operations until the leader's stop, a lost link or close(); the reason
    // ("stop", "closed", "lost: ...", "error: ..."). Blocks: call it on a thread of its own.
    std::string follow();
    // The leader's group was lost (a follower gone, a link cut): why, else "". Every plan then
    // fails, and every later request ends at once with this error.
    std::string tensor_lost() const;

private:
    struct task {
        enum kind_t { TASK_SUBMIT, TASK_EMBED, TASK_CANCEL } kind;
        int64_t id_request;
        int64_t id_owner;
        std::unique_ptr<generation_request> request;
        std::unique_ptr<request_sampler> sampler;
        std::vector<std::vector<int32_t>> inputs;
        uint64_t t_submit_us = steady_now_us();
        bool cancelled = false;           // cancelled while in the shared queue (pending_)
    };

    struct live_request {                 // engine-side state of an admitted generation
        std::unique_ptr<generation_request> request;
        std::unique_ptr<request_sampler> sampler;
        text_stream stream;
        int32_t n_prompt = 0;
        // sampling.prompt_logprobs: the rows found so far (prompt token k + 1 from the logits
        // at position k), until the first sample takes them out with its event
        std::vector<logprob_entry> prompt_rows;
        bool prompt_rows_sent = false;
        // a tensor split's rows for it: each follower's top `candidates` suffice, -1 whole (sampling.h)
        int32_t candidates = -1;

        bool wants_prompt_rows() const { return request->sampling.prompt_logprobs && !prompt_rows_sent; }
    };

    struct embed_job {
        int64_t id_request;
        int64_t id_owner;
        std::vector<std::vector<int32_t>> inputs;
        std::vector<float> out;
        size_t n_done = 0;
        int32_t n_tokens = 0;
    };

    // A context with its share of the slots, and the thread that steps it. Everything here
    // but `tasks` and `n_held` (under mu_tasks_) belongs to the lane's thread.
    struct lane {
        int32_t index = 0;
        llama_context * ctx = nullptr;
        llama_batch batch{};
        scheduler sched;
        std::unordered_map<int64_t, live_request> live;
        std::vector<engine_event> outgoing;   // this turn's events (flush_events)
        std::vector<task> tasks;              // posted for this lane, not taken yet
        int32_t n_slots = 0;                  // its share; set once (other lanes read it)
        int32_t n_held = 0;                   // requests taken from pending_ and not over
        float compute_scale_applied = 1.0f;
        std::thread thread;

        explicit lane(const scheduler_params & sp) : sched(sp) {}
    };

    void make_lanes(const llama_context_params & cp);
    int32_t n_to_take(const lane & ln) const;                     // under mu_tasks_
    void take_pending(lane & ln, std::vector<task> & incoming);   // under mu_tasks_
    void loop(lane & ln);
    void take_tasks(lane & ln, std::vector<task> & incoming);
    void cancel_embedding(int64_t id_request, std::vector<engine_event> & events);
    void step_generate(lane & ln);
    void step_embed(lane & ln);
    // `gather`: a tensor split's logits gather for this batch (lockstep.h; 0 rows whole)
    int32_t decode(lane & ln, uint32_t gather = 0);
    // The step's gather: the most candidates any of its output rows needs, or 0 (rows whole) when
    // one needs its whole row or more than lockstep_wire::kMaxGather.
    uint32_t gather_for(const lane & ln, const batch_plan & plan) const;
    void decode_plan(lane & ln, const batch_plan & plan, std::vector<int32_t> & logit_index,
                     std::vector<int32_t> & prompt_rows_at);
    // Prompt log-probabilities (sampling.prompt_logprobs): the rows of a prompt chunk decoded
    // from batch row `first`, and the prefix the slot's cache held, computed again at admission
    int32_t recompute_prefix(lane & ln, const plan_admission & adm);
    void take_prompt_rows(lane & ln, live_request & live, const std::vector<int32_t> & prompt,
                          int32_t pos0, int32_t n_tokens, int32_t first);
    logprob_entry logprob_entry_of(const float * logits, int32_t token, int32_t n_top) const;
    step_outcome sample(lane & ln, int64_t id_request, int32_t index, engine_event & event, int32_t n_before);
    step_outcome sample_guarded(lane & ln, int64_t id_request, int32_t index, engine_event & event,
                                int32_t n_before = 0);
    step_outcome sample_drafted(lane & ln, const plan_item & item, int32_t index, engine_event & event);
    void finish_events(lane & ln, const std::vector<int64_t> & finished, std::vector<engine_event> & events);
    void forget(lane & ln, int64_t id_request);
    void release_held(lane & ln, int64_t id_owner);
    void fail_plan(lane & ln, const batch_plan & plan, const std::string & error);
    // The prompt cache (engine_prompt_cache.cpp): admissions whose prompt starts with a saved
    // prefix longer than their slot holds get it from disk; prompts just prefilled are saved;
    // at load, the most recently used files go back into idle slots.
    void make_prompt_cache(const llama_context_params & cp);
    void preload_prefixes(lane & ln);
    void warm_up(lane & ln);
    void start_lanes(bool warm);
    void restore_prefixes(lane & ln, batch_plan & plan);
    void save_prefixes(lane & ln, const batch_plan & plan);
    engine_event failed_event(int64_t id_request, const std::string & error);
    void fail_everything(lane & ln, const std::string & error);
    void publish(lane & ln, std::vector<engine_event> & events);
    void flush_events(lane & ln);
    bool send_directly(lane & ln);
    void signal_reader();
    void drain_event_fd();

    // The queue's bookkeeping, per model and per owner (under mu_tasks_).
    submit_result enter_queue(int64_t id_owner);
    // How many of `reqs`, in order, the queue and their owners' shares have room for (all of
    // them: reqs.size()), and why the next one is refused (`why`). Changes nothing.
    size_t n_with_room(const std::vector<generation_request> & reqs, submit_result & why) const;
    void leave_queue();                            // admitted (or gone while queued)
    void leave_engine(int64_t id_owner);           // over: its owner's share has room again
    void leave_queue_and_engine(int64_t id_owner);

    engine_params  params_;
    llama_model *  model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    std::vector<int32_t> eog_tokens_;
    std::vector<std::unique_ptr<lane>> lanes_;
    std::mutex mu_decode_;                // one lane in llama_decode at a time (decode())
    std::vector<embed_job> embed_jobs_;   // lane 0's (embedding models have one lane)

    std::mutex mu_tasks_;
    std::condition_variable cv_;
    std::deque<task> pending_;            // several lanes: submitted, no lane has taken them yet
    std::unordered_map<int64_t, int32_t> n_held_of_;   // several lanes: owner -> requests lanes hold
    bool stop_ = false;
    int32_t n_queued_ = 0;
    std::unordered_map<int64_t, int32_t> n_owned_of_;    // owner -> requests queued or running
    int32_t n_max_owned_ = 0;             // key_share of the queue and the slots together
    std::atomic<int32_t> n_fail_decodes_{0};
    std::atomic<float> compute_scale_{1.0f};
    int32_t n_threads_full_ = 1;
    void apply_compute_scale(lane & ln);
    void unload_lane(lane & ln);
    // every llama_decode and KV operation goes through it (lockstep.h); pass-through when tp is off
    std::unique_ptr<lockstep> tp_;
    std::string decode_error(int32_t rc, const std::string & failure) const;
    std::atomic<bool> follow_stop_{false};
    bool tp_full_rows_ = false;           // set_tp_full_rows: every step gathers rows whole
    std::mutex mu_follow_;                // held by follow(): close() waits for it to return

    mutable std::mutex mu_events_;
    std::vector<engine_event> events_;
    std::unique_ptr<event_sink> sink_;     // under mu_events_: events_ and the sink move together
    int efd_ = -1;

    std::unique_ptr<prompt_cache> pcache_;   // null: off

    mutable std::mutex mu_stats_;
    engine_stats stats_;
    engine_observer obs_;
};
