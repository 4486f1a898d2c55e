// What the engine measures about itself: counters, latency histograms, gauges, each
// request's timings and the trace. The engine calls one hook per event of a request's life
// (queued, admitted, a token, finished) and one per step. Hooks run on the engine's lane
// threads (engine.h: one, or one per node of a pipelined placement) under one lock of their
// own, uncontended with one lane. Readers on other threads see counters through one lock
// taken once per step, histograms and gauges through relaxed atomics.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "counters.h"
#include "plan.h"
#include "scheduler.h"
#include "timings.h"
#include "trace.h"

class engine_observer {
public:
    engine_observer(int32_t n_slots, int32_t n_ctx_seq, bool embeddings, int32_t n_lanes = 1);

    // ---- hooks: the lane threads
    void queued(int64_t id_request, uint64_t t_submit_us, int32_t n_prompt);
    void admitted(const plan_admission & admission);
    void token(int64_t id_request);
    void drafted(int64_t id_request, int32_t n_drafted, int32_t n_accepted);
    // The request's last event is being built: count it, and return its timings.
    request_timings finished(int64_t id_request, request_status status);
    void step(const batch_plan & plan, uint64_t t_begin_us, const engine_stats & delta);
    // After every step of a lane: sample its gauges, publish the sums over lanes and the counters.
    void after_step(int32_t lane, const scheduler & sched, int32_t n_queued, int32_t n_embed_jobs);

    // ---- readers: any thread
    engine_stats counters() const;
    const engine_histograms & histograms() const { return hist_; }
    const engine_gauges & gauges() const { return gauges_; }
    trace_recorder & trace() { return trace_; }

private:
    void trace_request(int64_t id_request, const request_clock & clock, request_status status, uint64_t now);

    const int32_t n_slots_, n_ctx_seq_;
    const bool embeddings_;

    struct lane_gauges { int32_t n_running = 0, n_busy = 0, n_preempted = 0; size_t n_cells = 0; };

    std::mutex mu_hooks_;                                  // the hooks' state below
    std::unordered_map<int64_t, request_clock> clocks_;
    engine_stats pending_;                                 // since the last publish
    std::vector<lane_gauges> lanes_;

    mutable std::mutex mu_;
    engine_stats totals_;
    engine_histograms hist_;
    engine_gauges gauges_;
    trace_recorder trace_;
};

inline int32_t n_tokens_of(const std::vector<std::vector<int32_t>> & inputs) {
    size_t n = 0;
    for (const auto & input : inputs) {
        n += input.size();
    }
    return (int32_t) n;
}
