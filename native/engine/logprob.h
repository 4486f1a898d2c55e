// A sampled token's log-probability and its alternatives: what sampling finds (sampling.h) and
// what an event carries (engine_event.h), kept apart from both so the event's wire format
// (event_wire.h) needs no part of llama.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct token_logprob {
    int32_t     token;
    float       logprob;
    std::string piece;
};

struct logprob_entry {
    token_logprob              chosen;
    std::vector<token_logprob> top;
};
