// Where a request's time went, and the engine's latency histograms and gauges.
// Everything here is written by the engine thread alone and read by others: single-writer
// relaxed atomics, so an observation is a few plain loads and stores, never a lock.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

inline uint64_t steady_now_us() {
    return (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The instants of one request on the engine's steady clock (0: not reached).
struct request_clock {
    uint64_t t_submit_us = 0;       // submit() accepted it (the caller's thread)
    uint64_t t_admit_us  = 0;       // it got a slot
    uint64_t t_first_us  = 0;       // its first token was sampled
    uint64_t t_last_us   = 0;       // its latest token was sampled
    int32_t  n_prompt    = 0;
    int32_t  n_cached    = 0;
    int32_t  n_generated = 0;
    int32_t  n_drafted   = 0;       // drafted tokens verified (speculative decoding)
    int32_t  n_draft_accepted = 0;  // of them, accepted
};

// What the finishing event tells the caller: durations in microseconds (llama-server's
// `timings`, before unit conversion). `known` is false on every other event.
struct request_timings {
    bool    known            = false;
    int64_t t_queue_us       = 0;   // submitted -> slot
    int64_t t_prompt_us      = 0;   // slot -> first token: prefill of the uncached prompt
    int64_t t_first_token_us = 0;   // submitted -> first token
    int64_t t_predicted_us   = 0;   // first token -> last token
    int64_t n_drafted        = 0;   // drafted tokens verified (llama-server's draft_n)
    int64_t n_draft_accepted = 0;   // of them, accepted (draft_n_accepted)
};

inline request_timings timings_of(const request_clock & c) {
    request_timings t;
    t.known = true;
    const uint64_t admit = c.t_admit_us ? c.t_admit_us : c.t_submit_us;
    t.t_queue_us = (int64_t) (admit - c.t_submit_us);
    if (c.t_first_us) {
        t.t_prompt_us = (int64_t) (c.t_first_us - admit);
        t.t_first_token_us = (int64_t) (c.t_first_us - c.t_submit_us);
        t.t_predicted_us = (int64_t) (c.t_last_us - c.t_first_us);
    }
    t.n_drafted = c.n_drafted;
    t.n_draft_accepted = c.n_draft_accepted;
    return t;
}

// Bucket upper bounds, in the unit observed (microseconds or tokens). Chosen for a small
// CPU: a lone stream's token takes ~9 ms, sixteen streams' ~65 ms; a first token 5 ms+.
namespace histogram_bounds {
constexpr uint64_t queue_time[] = {1000, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000,
                                   2500000, 5000000, 10000000, 30000000, 60000000, 120000000};
constexpr uint64_t time_to_first_token[] = {5000, 10000, 20000, 40000, 60000, 80000, 100000, 150000,
                                            250000, 500000, 750000, 1000000, 2500000, 5000000,
                                            10000000, 20000000, 60000000};
constexpr uint64_t inter_token_latency[] = {1000, 2500, 5000, 7500, 10000, 15000, 20000, 30000, 40000,
                                            50000, 60000, 75000, 100000, 150000, 250000, 500000,
                                            1000000};
constexpr uint64_t e2e_request_latency[] = {10000, 25000, 50000, 100000, 250000, 500000, 1000000,
                                            2500000, 5000000, 10000000, 20000000, 40000000, 60000000,
                                            120000000, 300000000};
constexpr uint64_t request_prompt_tokens[] = {1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                              8192, 16384, 32768};
constexpr uint64_t request_generation_tokens[] = {1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                                  8192, 16384, 32768};
}  // namespace histogram_bounds

// X(field, Prometheus name after "stackd_", divisor from the observed unit to the Prometheus unit, help)
#define ENGINE_HISTOGRAMS(X)                                                                        \
    X(queue_time, "request_queue_time_seconds", 1e6, "Time from submission until a slot was free.") \
    X(time_to_first_token, "time_to_first_token_seconds", 1e6, "Time from submission to the first token.") \
    X(inter_token_latency, "inter_token_latency_seconds", 1e6, "Time between two tokens of one request.") \
    X(e2e_request_latency, "e2e_request_latency_seconds", 1e6, "Time from submission to the last event.") \
    X(request_prompt_tokens, "request_prompt_tokens", 1.0, "Prompt tokens of a finished request.")   \
    X(request_generation_tokens, "request_generation_tokens", 1.0, "Tokens a finished request generated.")

// X(field, Prometheus name after "stackd_", help)
#define ENGINE_GAUGES(X)                                                                            \
    X(num_requests_running, "num_requests_running", "Requests holding a slot (prefilling or decoding).") \
    X(num_requests_waiting, "num_requests_waiting", "Requests submitted and waiting for a slot.")     \
    X(kv_cache_usage_ratio, "kv_cache_usage_ratio", "KV cells held by running requests over all KV cells.") \
    X(slots_busy, "slots_busy", "Slots that hold a request.")

// A fixed-bucket histogram with one writer. counts[i] holds observations <= bounds[i]
// (the last: above every bound); the +Inf bucket and the count are derived by the reader.
class histogram {
public:
    static constexpr size_t MAX_BOUNDS = 24;

    template <size_t N>
    explicit histogram(const uint64_t (&bounds)[N]) : bounds_(bounds), n_bounds_(N) {
        static_assert(N <= MAX_BOUNDS, "too many buckets");
    }

    void observe(uint64_t value) {
        const size_t i = (size_t) (std::lower_bound(bounds_, bounds_ + n_bounds_, value) - bounds_);
        bump(counts_[i], 1);
        bump(sum_, value);
    }

    const uint64_t * bounds() const { return bounds_; }
    size_t n_bounds() const { return n_bounds_; }
    uint64_t count_at(size_t i) const { return counts_[i].load(std::memory_order_relaxed); }
    uint64_t sum() const { return sum_.load(std::memory_order_relaxed); }

private:
    static void bump(std::atomic<uint64_t> & a, uint64_t n) {   // single writer: no lock prefix
        a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }

    const uint64_t * bounds_;
    size_t n_bounds_;
    std::array<std::atomic<uint64_t>, MAX_BOUNDS + 1> counts_{};
    std::atomic<uint64_t> sum_{0};
};

struct engine_histograms {
#define ENGINE_HISTOGRAM_FIELD(field, name, divisor, help) histogram field{histogram_bounds::field};
    ENGINE_HISTOGRAMS(ENGINE_HISTOGRAM_FIELD)
#undef ENGINE_HISTOGRAM_FIELD
};

struct engine_gauges {
#define ENGINE_GAUGE_FIELD(field, name, help) std::atomic<double> field{0.0};
    ENGINE_GAUGES(ENGINE_GAUGE_FIELD)
#undef ENGINE_GAUGE_FIELD
};
