// Per-request sampling: a llama.cpp sampler chain built from the request's parameters,
// plus what the chain does not do (EOG suppression, log-probabilities).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "llama.h"

#include "grammar_prefix.h"
#include "logprob.h"

using logit_bias_list = std::vector<std::pair<int32_t, float>>;

// The one list of a request's sampling parameters: the struct below, the Python bindings
// (native/bindings.cpp) and the worker's wire format (server/runtime/clients.py reads the
// bound names) all come from it. X(type, name, default).
#define STACKD_SAMPLING_FIELDS(X)                                                        \
    X(float,           temperature,       1.0f)         /* 0: greedy */                  \
    X(float,           top_p,             1.0f)                                          \
    X(int32_t,         top_k,             0)            /* 0: off */                     \
    X(float,           min_p,             0.0f)                                          \
    X(uint32_t,        seed,              LLAMA_DEFAULT_SEED)                            \
    X(float,           presence_penalty,  0.0f)                                          \
    X(float,           frequency_penalty, 0.0f)                                          \
    X(float,           repeat_penalty,    1.0f)                                          \
    X(int32_t,         penalty_last_n,    64)                                            \
    X(logit_bias_list, logit_bias,        {})                                            \
    X(std::string,     grammar,           {})           /* GBNF; empty: none */          \
    X(bool,            grammar_lazy,      false)        /* off until a trigger matches */ \
    X(std::vector<std::string>, grammar_triggers, {})   /* regexes over the output text */ \
    X(std::vector<int32_t>, grammar_prefill, {})        /* tokens the grammar reads first */ \
    X(int32_t,         reasoning_budget,  -1)           /* thinking tokens; -1: no bound */ \
    X(std::string,     reasoning_start,   {})           /* the template's thinking tags */ \
    X(std::string,     reasoning_end,     {})           /* (empty: no thinking tracked) */ \
    X(std::vector<int32_t>, reasoning_forced, {})       /* tokens forced when it is spent */ \
    X(bool,            reasoning_open,    false)        /* the prompt opened the thinking */ \
    X(bool,            logprobs,          false)                                         \
    X(int32_t,         n_top_logprobs,    0)                                             \
    X(bool,            prompt_logprobs,   false)        /* every prompt token's too (echo) */ \
    X(int32_t,         min_tokens,        0)            /* end of generation waits */    \
    X(bool,            ignore_eos,        false)                                         \
    X(bool,            speculative,       true)         /* false: no drafting (opt-out) */

struct sampling_params {
#define STACKD_SAMPLING_MEMBER(type, name, init) type name = init;
    STACKD_SAMPLING_FIELDS(STACKD_SAMPLING_MEMBER)
#undef STACKD_SAMPLING_MEMBER
};

// How the sampler finds a token the grammar allows once the grammar has rejected the pick.
enum grammar_fallback {
    GRAMMAR_FALLBACK_BY_LOGIT,          // check tokens by descending logit until that decides it
    GRAMMAR_FALLBACK_FULL_VOCABULARY,   // run the grammar over every token (the reference)
};

// How often each way decided, for tests and benchmarks (the bindings name them from this list).
// X(member, name)
#define STACKD_GRAMMAR_COUNTS(X)                                                         \
    X(n_rejected,     rejected)        /* picks the grammar refused */                   \
    X(n_by_logit,     by_logit)        /* decided by a walk down the tokens by logit */  \
    X(n_by_rejection, by_rejection)    /* by drawing again (chains truncating nothing) */ \
    X(n_full,         full)            /* needed the full-vocabulary pass */             \
    X(n_checked,      checked)         /* tokens the walks ran through the grammar */

struct grammar_counts {
#define STACKD_GRAMMAR_COUNT_MEMBER(member, name) int64_t member = 0;
    STACKD_GRAMMAR_COUNTS(STACKD_GRAMMAR_COUNT_MEMBER)
#undef STACKD_GRAMMAR_COUNT_MEMBER
};

// The sampler of one request: a llama.cpp chain for the sampling parameters and, apart from
// it, the grammar. The grammar is checked lazily, as llama-server does: the chain picks a token
// from the raw distribution and the grammar only vets that one token. When it rejects the pick,
// the grammar sees the tokens of highest logit first, a growing batch at a time, and the chain
// picks among the allowed ones as soon as no unchecked token could change the outcome
// (grammar_prefix.h says when, and why that is the full-vocabulary pass's outcome); at worst the
// walk ends having checked every token, which is the full pass. Chains that truncate nothing are
// decided by no prefix: they draw again a few times, then run the full pass. The engine thread steps
// every sequence, so a grammar's cost is everyone's latency. Throws std::invalid_argument when
// the grammar does not parse.
class request_sampler {
public:
    request_sampler(const sampling_params & params, const llama_vocab * vocab,
                    grammar_fallback fallback = GRAMMAR_FALLBACK_BY_LOGIT);
    ~request_sampler();
    request_sampler(const request_sampler &) = delete;
    request_sampler & operator=(const request_sampler &) = delete;

    // The next token from one row of logits, or LLAMA_TOKEN_NULL when the grammar allows none.
    // `eog` (sorted) tokens are suppressed when `suppress_eog`, unless the grammar allows
    // nothing else: a completed grammar wins over min_tokens / ignore_eos.
    llama_token sample(const float * logits, int32_t n_vocab, bool suppress_eog,
                       const std::vector<int32_t> & eog);
    // Advance the grammar and the penalties' history past `token`.
    void accept(llama_token token);

    const grammar_counts & counts() const { return counts_; }

    // The thinking budget (reasoning_*): where the answer is, for tests.
    enum thinking_state { THINKING_OFF, THINKING_IDLE, THINKING_COUNTING, THINKING_FORCING, THINKING_DONE };
    thinking_state thinking() const { return thinking_; }
    int32_t thinking_tokens() const { return n_thinking_; }

private:
    void track_thinking(llama_token token);
    bool grammar_sleeps() const;

    void load(const float * logits, int32_t n_vocab);
    void suppress(const std::vector<int32_t> & eog);
    llama_token selected() const;
    llama_token draw(const float * logits, int32_t n_vocab, bool suppress_eog, const std::vector<int32_t> & eog);
    bool grammar_allows(llama_token token);
    bool grammar_allows_other_than(const std::vector<int32_t> & eog) const;
    llama_token redraw(const float * logits, int32_t n_vocab, bool suppress_eog, const std::vector<int32_t> & eog);
    llama_token walk_by_logit(const float * logits, int32_t n_vocab, bool suppress_eog,
                              const std::vector<int32_t> & eog);
    void check_batch(size_t begin, size_t end);
    llama_token pick_among_found();
    llama_token pick_among_end(const float * logits, int32_t n_vocab, const std::vector<int32_t> & eog);
    llama_token full_vocabulary(const float * logits, int32_t n_vocab, bool suppress_eog,
                                const std::vector<int32_t> & eog);

    llama_sampler * adjust_  = nullptr;   // per-token: logit bias, penalties
    llama_sampler * pick_    = nullptr;   // greedy, or top-k, top-p, min-p, temperature, draw
    llama_sampler * grammar_ = nullptr;
    pick_filters filters_;
    bool greedy_in_place_ = false;        // greedy with nothing to adjust: draw reads the row in place
    grammar_fallback fallback_;
    grammar_counts counts_;
    std::vector<llama_token_data> cur_;
    llama_token_data_array cur_p_{};
    // the walk by logit
    std::vector<llama_token_data> order_;    // tokens with a chance, the checked head sorted by logit
    std::vector<llama_token_data> batch_;    // the tokens of one grammar check, in id order
    std::vector<char> in_batch_;             // per token id: does the batch being built hold it
    std::vector<llama_token_data> found_;    // allowed tokens found, by descending logit
    prefix_seen seen_;
    // the thinking budget: the tags are matched on the text (a tag the model spells in other
    // tokens still counts), the forced end is the template's own tokens
    const llama_vocab * vocab_ = nullptr;
    bool grammar_lazy_ = false;
    thinking_state thinking_ = THINKING_OFF;
    int32_t budget_ = -1;
    int32_t n_thinking_ = 0;             // thinking tokens so far, over every block
    size_t force_pos_ = 0;
    std::string start_tag_, end_tag_, tail_;
    std::vector<int32_t> forced_;
};

// Tensor parallelism's candidates path (lockstep.h, kernels/src/tp.h): how many of each
// follower's highest logits a row must carry for this request's next token to be exactly the
// one the whole row gives, or -1 when it needs the whole row. The leader's row then holds its
// own rows and each follower's top K, the rest -inf. A request whose pick depends only on its
// row's top k tokens (greedy: k = 1; temperature > 0 with top_k = k, after which top-p, min-p
// and temperature act over those k alone and renormalise) needs k + the tokens it may lower
// (a negative logit_bias each, every end-of-generation token while min_tokens / ignore_eos
// suppress them): a token it lowers can push at most one other into its top k. Anything that
// raises a token or reads the whole row needs it whole: grammar, penalties, a positive (or NaN)
// logit_bias, logprobs / top logprobs / prompt logprobs, temperature > 0 without top_k.
// (docs/cluster.md, "Tensor parallelism", lists every parameter.)
int32_t candidates_needed(const sampling_params & params, int32_t n_eog);

// log-softmax statistics of one row of logits, for the chosen token and the top-n.
struct logit_stats {
    float log_sum_exp;
    std::vector<std::pair<int32_t, float>> top;   // (token, logit), highest first
};
logit_stats logit_stats_of(const float * logits, int32_t n_vocab, int32_t n_top);

// A token's text; a control token (BOS, EOS, <|im_end|>) is empty unless `special`.
std::string token_piece(const llama_vocab * vocab, int32_t token, bool special = false);
