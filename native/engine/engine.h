// The engine: one loaded model, its context, and a scheduler thread that runs continuous
// batching without ever touching Python. Callers post id-tagged tasks (submit, cancel);
// the thread drains them between steps and publishes events, then signals an eventfd
// that the event loop watches. Embedding models run the same loop with a simpler step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "counters.h"
#include "devices.h"
#include "frame_sink.h"
#include "llama.h"
#include "observer.h"
#include "sampling.h"
#include "scheduler.h"
#include "text_stream.h"

struct engine_params {
    std::string model_path;
    bool        embeddings    = false;   // an embedding model: pooled vectors, no sampling
    int32_t     n_slots       = 4;       // sequences decoded together
    int32_t     n_ctx_seq     = 2048;    // context of one sequence (prompt + output)
    int32_t     n_batch       = 512;     // tokens per decode step at most
    int32_t     n_ubatch      = 0;       // tokens per micro-batch (0: the step, up to 512); smaller
                                         // lets pipeline-parallel devices overlap within a step
    int32_t     n_threads     = 0;       // 0: all cores
    int32_t     n_max_waiting = 256;     // queued requests beyond which submit() refuses
    int32_t     flash_attn    = -1;      // llama_flash_attn_type: -1 auto, 0 off, 1 on
    float       key_share     = 1.0f;    // most of the slots and of the queue one owner may hold
    bool        quiet         = true;    // silence llama.cpp's own logging
    placement_params placement;          // empty: every layer on this CPU
};

struct generation_request {
    int64_t                  id_request = 0;
    int64_t                  id_owner   = 0;     // the API key that asked: the unit of fair share
    std::vector<int32_t>     prompt;
    int32_t                  max_tokens = 16;
    std::vector<std::string> stop;
    sampling_params          sampling;
};

struct engine_event {
    int64_t                    id_request = 0;
    std::string                text;              // UTF-8 bytes released by this event
    int32_t                    n_tokens   = 0;    // tokens generated in this event
    request_status             status     = REQUEST_STATUS_RUNNING;
    int32_t                    n_prompt   = 0;
    int32_t                    n_cached   = 0;    // prompt tokens reused from the KV cache
    int32_t                    n_generated = 0;
    std::vector<logprob_entry> logprobs;
    std::vector<float>         embedding;         // embedding requests: n_inputs * n_embd
    std::string                error;
    request_timings            timings;           // the finishing event: where the time went
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
    submit_result submit_embedding(int64_t id_request, int64_t id_owner,
                                   std::vector<std::vector<int32_t>> inputs);
    void cancel(int64_t id_request);
    // Throttle to a share of full compute (a power contract): threads and admitted slots in
    // proportion, never below one of each. Applied between steps.
    void set_compute_scale(float scale);
    // Testing: make the next `n` decode calls fail as llama_decode can (no KV room, abort).
    void fail_next_decodes(int32_t n) { n_fail_decodes_ = n; }
    std::vector<engine_event> take_events();
    void close();

    // An engine worker's socket to the daemon (frame_sink.h). Once attached, a step whose
    // events end no request is framed and sent from the engine thread itself, with no wake-up
    // of the event fd's reader, provided nothing is queued before it; everything else goes the
    // usual way (events kept, event fd signalled) and the reader relays it with
    // relay_events(), so the stream stays in step order. Attach before the first submit.
    void attach_sink(int fd);
    frame_sink * sink() { return sink_.get(); }
    // The reader's half: takes the kept events and writes them to the sink as one frame.
    // Returns whether any of them ends a request.
    bool relay_events();

    int event_fd() const { return efd_; }
    engine_stats stats() const;
    engine_observer & observer() { return obs_; }   // histograms, gauges, the trace

    // The model, for callers (thread-safe: read-only after load).
    std::vector<int32_t> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string          piece(int32_t token) const { return token_piece(vocab_, token); }
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

private:
    struct task {
        enum kind_t { TASK_SUBMIT, TASK_EMBED, TASK_CANCEL } kind;
        int64_t id_request;
        int64_t id_owner;
        std::unique_ptr<generation_request> request;
        std::unique_ptr<request_sampler> sampler;
        std::vector<std::vector<int32_t>> inputs;
        uint64_t t_submit_us = steady_now_us();
    };

    struct live_request {                 // engine-side state of an admitted generation
        std::unique_ptr<generation_request> request;
        std::unique_ptr<request_sampler> sampler;
        text_stream stream;
        int32_t n_prompt = 0;
    };

    struct embed_job {
        int64_t id_request;
        int64_t id_owner;
        std::vector<std::vector<int32_t>> inputs;
        std::vector<float> out;
        size_t n_done = 0;
        int32_t n_tokens = 0;
    };

    void loop();
    void take_tasks(std::vector<task> & incoming);
    void cancel_embedding(int64_t id_request, std::vector<engine_event> & events);
    void step_generate();
    void step_embed();
    int32_t decode();
    void decode_plan(const batch_plan & plan, std::vector<int32_t> & logit_index);
    step_outcome sample(int64_t id_request, int32_t index, engine_event & event);
    step_outcome sample_guarded(int64_t id_request, int32_t index, engine_event & event);
    void finish_events(const std::vector<int64_t> & finished, std::vector<engine_event> & events);
    void fail_plan(const batch_plan & plan, const std::string & error);
    void fail_everything(const std::string & error);
    void publish(std::vector<engine_event> & events);
    void flush_events();
    bool send_directly();
    void signal_reader();
    void drain_event_fd();

    // The queue's bookkeeping, per model and per owner (under mu_tasks_).
    submit_result enter_queue(int64_t id_owner);
    void leave_queue(int64_t id_owner);

    engine_params  params_;
    llama_model *  model_ = nullptr;
    llama_context * ctx_  = nullptr;
    const llama_vocab * vocab_ = nullptr;
    llama_batch    batch_{};
    std::vector<int32_t> eog_tokens_;

    scheduler sched_;
    std::unordered_map<int64_t, live_request> live_;
    std::vector<embed_job> embed_jobs_;

    std::thread thread_;
    std::mutex mu_tasks_;
    std::condition_variable cv_;
    std::vector<task> tasks_;
    bool stop_ = false;
    int32_t n_queued_ = 0;
    std::unordered_map<int64_t, int32_t> n_queued_of_;   // owner -> requests in the queue
    int32_t n_max_queued_per_owner_ = 0;
    std::atomic<int32_t> n_fail_decodes_{0};
    std::atomic<float> compute_scale_{1.0f};
    float compute_scale_applied_ = 1.0f;
    int32_t n_threads_full_ = 1;
    void apply_compute_scale();

    mutable std::mutex mu_events_;
    std::vector<engine_event> events_;
    std::unique_ptr<frame_sink> sink_;     // under mu_events_: events_ and the sink move together
    std::vector<engine_event> outgoing_;   // this turn's events, engine thread only (flush_events)
    int efd_ = -1;

    mutable std::mutex mu_stats_;
    engine_stats stats_;
    engine_observer obs_;
};
