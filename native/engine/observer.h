// What the engine measures about itself: counters, latency histograms, gauges, each
// request's timings and the trace. The engine calls one hook per event of a request's life
// (queued, admitted, a token, finished) and one per step; every hook runs on the engine
// thread, so per-request state needs no lock. Readers on other threads see counters
// through one lock taken once per step, histograms and gauges through relaxed atomics.
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
    engine_observer(int32_t n_slots, int32_t n_ctx_seq, bool embeddings);

    // ---- hooks: the engine thread only
    void queued(int64_t id_request, uint64_t t_submit_us, int32_t n_prompt);
    void admitted(const plan_admission & admission);
    void token(int64_t id_request);
    // The request's last event is being built: count it, and return its timings.
    request_timings finished(int64_t id_request, request_status status);
    void step(const batch_plan & plan, uint64_t t_begin_us, const engine_stats & delta);
    // After every step: sample the gauges and publish the counters.
    void after_step(const scheduler & sched, int32_t n_queued, int32_t n_embed_jobs);

    // ---- readers: any thread
    engine_stats counters() const;
    const engine_histograms & histograms() const { return hist_; }
    const engine_gauges & gauges() const { return gauges_; }
    trace_recorder & trace() { return trace_; }

private:
    void trace_request(int64_t id_request, const request_clock & clock, request_status status, uint64_t now);

    const int32_t n_slots_, n_ctx_seq_;
    const bool embeddings_;

    std::unordered_map<int64_t, request_clock> clocks_;   // engine thread only
    engine_stats pending_;                                 // engine thread only: since the last publish

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
