// What an engine tells its caller about one request: each step's events (engine.h's
// take_events and event sink), and the unit of the event wire between a worker and the daemon
// (event_wire.h). Its own header, so the wire format and the sinks include this and not the
// whole engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "logprob.h"
#include "status.h"
#include "timings.h"

struct engine_event {
    int64_t                    id_request = 0;
    std::string                text;              // UTF-8 bytes released by this event
    int32_t                    n_tokens   = 0;    // tokens generated in this event
    request_status             status     = REQUEST_STATUS_RUNNING;
    int32_t                    n_prompt   = 0;
    int32_t                    n_cached   = 0;    // prompt tokens reused from the KV cache
    int32_t                    n_generated = 0;
    std::vector<logprob_entry> logprobs;
    // sampling.prompt_logprobs: the request's first sampled event carries the log-probability of
    // each prompt token after the first (which has none), with n_top_logprobs alternatives
    std::vector<logprob_entry> prompt_logprobs;
    std::vector<float>         embedding;         // embedding requests: n_inputs * n_embd
    std::string                error;
    std::string                stop;              // the finishing event: the stop string that ended it
    request_timings            timings;           // the finishing event: where the time went
};
