// The engine trace: while a recording runs, the engine thread appends one record per step
// and per request; the caller collects them and turns them into Chrome trace events.
// Off, a hook costs one relaxed load of a flag (STACKD_NO_TRACE compiles even that out,
// for the overhead benchmark).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

enum trace_kind : uint8_t {
    TRACE_STEP,      // one generation step: t_begin..t_end, phases in d[]
    TRACE_PREFILL,   // one prompt chunk of a request, decoded within a step
    TRACE_REQUEST,   // a finished request: submitted, admitted, first and last token, finished
};

enum trace_phase : uint8_t { PHASE_SCHEDULE, PHASE_BATCH, PHASE_DECODE, PHASE_SAMPLE, PHASE_EMIT, N_PHASES };

struct trace_record {
    trace_kind kind;
    uint8_t    status     = 0;     // TRACE_REQUEST: its finished status
    int64_t    id_request = -1;
    uint64_t   t_begin_us = 0;     // STEP: schedule starts; PREFILL: decode starts; REQUEST: submitted
    uint64_t   t_end_us   = 0;     // STEP: emit ends; PREFILL: decode ends; REQUEST: finished
    uint64_t   t_admit_us = 0;     // REQUEST
    uint64_t   t_first_us = 0;     // REQUEST
    uint64_t   t_last_us  = 0;     // REQUEST
    uint32_t   d_us[N_PHASES] = {};// STEP: microseconds per phase
    int32_t    n_items    = 0;     // STEP: plan items
    int32_t    n_tokens   = 0;     // STEP: tokens decoded; PREFILL: chunk tokens; REQUEST: generated
    int32_t    n_sampled  = 0;     // STEP
    int32_t    n_prompt   = 0;     // REQUEST
    int32_t    n_cached   = 0;     // REQUEST
};

class trace_recorder {
public:
    static constexpr size_t MAX_RECORDS = 1 << 20;   // ~100 MiB at most, far beyond 60 s of steps

    bool on() const {
#ifdef STACKD_NO_TRACE
        return false;
#else
        return on_.load(std::memory_order_relaxed);
#endif
    }
    bool start();                         // false: a recording already runs
    std::vector<trace_record> stop();     // the records since start(); recording stops
    void add(const trace_record & record);

private:
    std::atomic<bool> on_{false};
    std::mutex mu_;
    std::vector<trace_record> records_;
};
