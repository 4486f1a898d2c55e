#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

request_sampler::request_sampler(const sampling_params & p, const llama_vocab * vocab) {
    if (!p.grammar.empty()) {
        grammar_ = llama_sampler_init_grammar(vocab, p.grammar.c_str(), "root");
        if (grammar_ == nullptr) {
            throw std::invalid_argument("the grammar does not parse");
        }
    }
    llama_sampler_chain_params chain_params = llama_sampler_chain_default_params();
    chain_params.no_perf = true;
    chain_ = llama_sampler_chain_init(chain_params);

    if (!p.logit_bias.empty()) {
        std::vector<llama_logit_bias> bias;
        bias.reserve(p.logit_bias.size());
        for (const auto & [token, value] : p.logit_bias) {
            bias.push_back({token, value});
        }
        llama_sampler_chain_add(chain_, llama_sampler_init_logit_bias(
            llama_vocab_n_tokens(vocab), (int32_t) bias.size(), bias.data()));
    }
    if (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
        llama_sampler_chain_add(chain_, llama_sampler_init_penalties(
            llama_vocab_n_tokens(vocab), p.penalty_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty));
    }
    if (p.temperature <= 0.0f) {
        llama_sampler_chain_add(chain_, llama_sampler_init_greedy());
        return;
    }
    if (p.top_k > 0) {
        llama_sampler_chain_add(chain_, llama_sampler_init_top_k(p.top_k));
    }
    if (p.top_p < 1.0f) {
        llama_sampler_chain_add(chain_, llama_sampler_init_top_p(p.top_p, 1));
    }
    if (p.min_p > 0.0f) {
        llama_sampler_chain_add(chain_, llama_sampler_init_min_p(p.min_p, 1));
    }
    llama_sampler_chain_add(chain_, llama_sampler_init_temp(p.temperature));
    llama_sampler_chain_add(chain_, llama_sampler_init_dist(p.seed));
}

request_sampler::~request_sampler() {
    if (chain_ != nullptr) {
        llama_sampler_free(chain_);
    }
    if (grammar_ != nullptr) {
        llama_sampler_free(grammar_);
    }
}

void request_sampler::load(const float * logits, int32_t n_vocab) {
    cur_.resize(n_vocab);
    for (int32_t t = 0; t < n_vocab; ++t) {
        cur_[t] = {t, logits[t], 0.0f};
    }
    cur_p_ = {cur_.data(), cur_.size(), -1, false};
}

void request_sampler::suppress(const std::vector<int32_t> & eog) {
    for (int32_t t : eog) {            // cur_ is still in token order: nothing has sorted it yet
        cur_[t].logit = -INFINITY;
    }
}

bool request_sampler::grammar_allows(llama_token token) {
    llama_token_data single = {token, 1.0f, 0.0f};
    llama_token_data_array one = {&single, 1, -1, false};
    llama_sampler_apply(grammar_, &one);
    return single.logit != -INFINITY;
}

bool request_sampler::grammar_allows_other_than(const std::vector<int32_t> & eog) const {
    for (size_t i = 0; i < cur_p_.size; ++i) {
        const llama_token_data & d = cur_p_.data[i];
        if (d.logit != -INFINITY && !std::binary_search(eog.begin(), eog.end(), d.id)) {
            return true;
        }
    }
    return false;
}

llama_token request_sampler::sample(const float * logits, int32_t n_vocab, bool suppress_eog,
                                    const std::vector<int32_t> & eog) {
    load(logits, n_vocab);
    if (suppress_eog) {
        suppress(eog);
    }
    llama_sampler_apply(chain_, &cur_p_);
    if (cur_p_.selected >= 0) {
        const llama_token_data & pick = cur_p_.data[cur_p_.selected];
        if (pick.logit != -INFINITY && (grammar_ == nullptr || grammar_allows(pick.id))) {
            return pick.id;
        }
    }
    if (grammar_ == nullptr) {
        return LLAMA_TOKEN_NULL;
    }
    // The grammar refused the pick: let it speak first, over the whole vocabulary.
    load(logits, n_vocab);
    llama_sampler_apply(grammar_, &cur_p_);
    if (suppress_eog && grammar_allows_other_than(eog)) {
        suppress(eog);
    }
    llama_sampler_apply(chain_, &cur_p_);
    if (cur_p_.selected < 0 || cur_p_.data[cur_p_.selected].logit == -INFINITY) {
        return LLAMA_TOKEN_NULL;
    }
    return cur_p_.data[cur_p_.selected].id;
}

void request_sampler::accept(llama_token token) {
    if (grammar_ != nullptr) {
        llama_sampler_accept(grammar_, token);
    }
    llama_sampler_accept(chain_, token);
}

logit_stats logit_stats_of(const float * logits, int32_t n_vocab, int32_t n_top) {
    const float max = *std::max_element(logits, logits + n_vocab);
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += std::exp((double) (logits[i] - max));
    }
    logit_stats stats{max + (float) std::log(sum), {}};
    if (n_top > 0) {
        std::vector<int32_t> ids(n_vocab);
        std::iota(ids.begin(), ids.end(), 0);
        const int32_t n = std::min(n_top, n_vocab);
        std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                          [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
        for (int32_t i = 0; i < n; ++i) {
            stats.top.emplace_back(ids[i], logits[ids[i]]);
        }
    }
    return stats;
}

std::string token_piece(const llama_vocab * vocab, int32_t token) {
    char buf[256];
    int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, false);
    if (n >= 0) {
        return std::string(buf, n);
    }
    std::string big(-n, '\0');
    n = llama_token_to_piece(vocab, token, big.data(), (int32_t) big.size(), 0, false);
    return n >= 0 ? big.substr(0, n) : std::string();
}
