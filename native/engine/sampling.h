// Per-request sampling: a llama.cpp sampler chain built from the request's parameters,
// plus what the chain does not do (EOG suppression, log-probabilities).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "llama.h"

struct sampling_params {
    float    temperature       = 1.0f;   // 0: greedy
    float    top_p             = 1.0f;
    int32_t  top_k             = 0;      // 0: off
    float    min_p             = 0.0f;
    uint32_t seed              = LLAMA_DEFAULT_SEED;
    float    presence_penalty  = 0.0f;
    float    frequency_penalty = 0.0f;
    float    repeat_penalty    = 1.0f;
    int32_t  penalty_last_n    = 64;
    std::vector<std::pair<int32_t, float>> logit_bias;
    std::string grammar;                 // GBNF; empty: none
    bool     logprobs          = false;
    int32_t  n_top_logprobs    = 0;
    int32_t  min_tokens        = 0;      // end-of-generation is suppressed until this many
    bool     ignore_eos        = false;
};

struct token_logprob {
    int32_t     token;
    float       logprob;
    std::string piece;
};

struct logprob_entry {
    token_logprob              chosen;
    std::vector<token_logprob> top;
};

// Owns a sampler chain; throws std::invalid_argument when the grammar does not parse.
class sampler_chain {
public:
    sampler_chain(const sampling_params & params, const llama_vocab * vocab);
    ~sampler_chain();
    sampler_chain(const sampler_chain &) = delete;
    sampler_chain & operator=(const sampler_chain &) = delete;

    llama_sampler * get() const { return chain_; }

private:
    llama_sampler * chain_ = nullptr;
};

// log-softmax statistics of one row of logits, for the chosen token and the top-n.
struct logit_stats {
    float log_sum_exp;
    std::vector<std::pair<int32_t, float>> top;   // (token, logit), highest first
};
logit_stats logit_stats_of(const float * logits, int32_t n_vocab, int32_t n_top);

std::string token_piece(const llama_vocab * vocab, int32_t token);
