#include "sampling.h"
#include "sampling_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

namespace {

// The walk by logit checks this many tokens first, then twice as many each round: the model's
// favourites are checked at once, and a walk checks at most twice the tokens it needed.
constexpr size_t k_first_batch = 64;
constexpr size_t k_batch_growth = 2;
// Once a batch would reach this fraction of the tokens, the walk checks all the rest unsorted,
// which bounds it at the full pass plus sorting a few thousand tokens.
constexpr size_t k_rest_at_once = 8;
// Chains that truncate nothing draw from every allowed token, so a prefix never decides them;
// drawing again from the same distribution until the grammar allows the draw gives exactly the
// distribution restricted to what it allows (rejection sampling). A few tries, then the full pass.
constexpr int k_redraws = 3;

// The walk's order: by logit, descending; equal logits by id, as greedy breaks ties.
bool by_logit(const llama_token_data & a, const llama_token_data & b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// What llama.cpp's greedy sampler selects from a row of logits loaded in token order: the
// first highest (a later one must be strictly higher; a NaN never wins, except at token 0,
// which nothing then beats). Read in place, eight independent lanes of the comparison (lane
// k sees tokens k, k + 8, ...), merged by value and then by the lowest token: the same token.
constexpr int32_t k_argmax_lanes = 8;

int32_t first_highest(const float * logits, int32_t n) {
    if (n <= 0 || std::isnan(logits[0])) {
        return 0;
    }
    float best[k_argmax_lanes];
    int32_t at[k_argmax_lanes];
    for (int32_t k = 0; k < k_argmax_lanes; ++k) {
        best[k] = -INFINITY;
        at[k] = -1;
    }
    int32_t t = 0;
    for (; t + k_argmax_lanes <= n; t += k_argmax_lanes) {
        for (int32_t k = 0; k < k_argmax_lanes; ++k) {
            if (logits[t + k] > best[k]) {
                best[k] = logits[t + k];
                at[k] = t + k;
            }
        }
    }
    for (int32_t k = 0; t + k < n; ++k) {
        if (logits[t + k] > best[k]) {
            best[k] = logits[t + k];
            at[k] = t + k;
        }
    }
    int32_t winner = 0;                     // token 0 when every logit is -inf
    float top = logits[0];
    for (int32_t k = 0; k < k_argmax_lanes; ++k) {
        if (at[k] >= 0 && (best[k] > top || (best[k] == top && at[k] < winner))) {
            top = best[k];
            winner = at[k];
        }
    }
    return winner;
}

}  // namespace

request_sampler::request_sampler(const sampling_params & p, const llama_vocab * vocab, grammar_fallback fallback)
    : fallback_(fallback), vocab_(vocab), grammar_lazy_(p.grammar_lazy) {
    if (!p.reasoning_end.empty()) {
        const int32_t n_vocab = llama_vocab_n_tokens(vocab);
        for (int32_t t : p.reasoning_forced) {
            if (t < 0 || t >= n_vocab) {
                throw std::invalid_argument("a forced end-of-thinking token is outside the vocabulary");
            }
        }
        start_tag_ = p.reasoning_start;
        end_tag_ = p.reasoning_end;
        forced_ = p.reasoning_forced;
        budget_ = forced_.empty() ? -1 : p.reasoning_budget;     // nothing to force: no bound
        thinking_ = p.reasoning_open ? THINKING_COUNTING : THINKING_IDLE;
        if (thinking_ == THINKING_COUNTING && budget_ == 0) {
            thinking_ = THINKING_FORCING;
        }
    }
    if (!p.grammar.empty() && p.grammar_lazy) {
        // a tool call's grammar under tool_choice auto: free text until the family's trigger
        // (e.g. "<tool_call>") appears in the output, the grammar from there on
        std::vector<const char *> patterns;
        for (const std::string & pattern : p.grammar_triggers) {
            patterns.push_back(pattern.c_str());
        }
        grammar_ = llama_sampler_init_grammar_lazy_patterns(vocab, p.grammar.c_str(), "root",
                                                            patterns.data(), patterns.size(), nullptr, 0);
        if (grammar_ == nullptr) {
            throw std::invalid_argument("the grammar does not parse");
        }
    } else if (!p.grammar.empty()) {
        grammar_ = llama_sampler_init_grammar(vocab, p.grammar.c_str(), "root");
        if (grammar_ == nullptr) {
            throw std::invalid_argument("the grammar does not parse");
        }
        // a family's tool-call grammar starts at the generation prompt (llama.cpp prefills it
        // with the prompt's last tokens, "<|im_start|>assistant\n<think>\n"): read them first
        const int32_t n_vocab = llama_vocab_n_tokens(vocab);
        for (int32_t t : p.grammar_prefill) {
            if (t < 0 || t >= n_vocab || !grammar_allows(t)) {
                llama_sampler_free(grammar_);
                grammar_ = nullptr;
                throw std::invalid_argument("the grammar does not start with the generation prompt");
            }
            llama_sampler_accept(grammar_, t);
        }
    }
    llama_sampler_chain_params chain_params = llama_sampler_chain_default_params();
    chain_params.no_perf = true;
    adjust_ = llama_sampler_chain_init(chain_params);
    pick_ = llama_sampler_chain_init(chain_params);

    if (!p.logit_bias.empty()) {
        std::vector<llama_logit_bias> bias;
        bias.reserve(p.logit_bias.size());
        for (const auto & [token, value] : p.logit_bias) {
            bias.push_back({token, value});
        }
        llama_sampler_chain_add(adjust_, llama_sampler_init_logit_bias(
            llama_vocab_n_tokens(vocab), (int32_t) bias.size(), bias.data()));
    }
    if (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
        llama_sampler_chain_add(adjust_, llama_sampler_init_penalties(
            llama_vocab_n_tokens(vocab), p.penalty_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty));
    }
    if (p.temperature <= 0.0f) {
        filters_.greedy = true;
        llama_sampler_chain_add(pick_, llama_sampler_init_greedy());
        greedy_in_place_ = llama_sampler_chain_n(adjust_) == 0;
        return;
    }
    filters_ = {false, p.top_k, p.top_p, p.min_p};
    if (p.top_k > 0) {
        llama_sampler_chain_add(pick_, llama_sampler_init_top_k(p.top_k));
    }
    if (p.top_p < 1.0f) {
        llama_sampler_chain_add(pick_, llama_sampler_init_top_p(p.top_p, 1));
    }
    if (p.min_p > 0.0f) {
        llama_sampler_chain_add(pick_, llama_sampler_init_min_p(p.min_p, 1));
    }
    llama_sampler_chain_add(pick_, llama_sampler_init_temp(p.temperature));
    llama_sampler_chain_add(pick_, llama_sampler_init_dist(p.seed));
}

request_sampler::~request_sampler() {
    for (llama_sampler * s : {pick_, adjust_, grammar_}) {
        if (s != nullptr) {
            llama_sampler_free(s);
        }
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

llama_token request_sampler::selected() const {
    if (cur_p_.selected < 0 || cur_p_.data[cur_p_.selected].logit == -INFINITY) {
        return LLAMA_TOKEN_NULL;
    }
    return cur_p_.data[cur_p_.selected].id;
}

// One draw of the chain from the raw distribution, the grammar aside.
llama_token request_sampler::draw(const float * logits, int32_t n_vocab, bool suppress_eog,
                                  const std::vector<int32_t> & eog) {
    if (greedy_in_place_) {
        // the chain's pick without loading the row into cur_ (12 bytes a token, the vocabulary
        // for every sequence of every step); suppressing end-of-generation changes the pick only
        // when the first highest is one of them, and then the chain decides as before
        const int32_t token = first_highest(logits, n_vocab);
        const bool suppressed = suppress_eog && std::binary_search(eog.begin(), eog.end(), token);
        if (!suppressed) {
            return logits[token] == -INFINITY ? LLAMA_TOKEN_NULL : token;
        }
    }
    load(logits, n_vocab);
    if (suppress_eog) {
        suppress(eog);
    }
    llama_sampler_apply(adjust_, &cur_p_);
    llama_sampler_apply(pick_, &cur_p_);
    return selected();
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
    if (thinking_ == THINKING_FORCING) {
        // the budget is spent: the end-of-thinking tag, token by token, whatever the logits say;
        // a grammar that is awake (not a lazy one asleep in the thinking) has the last word: if
        // it refuses the tag, the answer goes on unforced
        const llama_token forced = forced_[force_pos_];
        if (grammar_ == nullptr || grammar_sleeps() || grammar_allows(forced)) {
            return forced;
        }
        thinking_ = THINKING_DONE;
    }
    const llama_token pick = draw(logits, n_vocab, suppress_eog, eog);
    if (grammar_ == nullptr || (pick != LLAMA_TOKEN_NULL && grammar_allows(pick))) {
        return pick;
    }
    ++counts_.n_rejected;
    if (fallback_ == GRAMMAR_FALLBACK_BY_LOGIT && !filters_.keeps_everything()) {
        ++counts_.n_by_logit;
        return walk_by_logit(logits, n_vocab, suppress_eog, eog);
    }
    if (fallback_ == GRAMMAR_FALLBACK_BY_LOGIT) {
        const llama_token token = redraw(logits, n_vocab, suppress_eog, eog);
        if (token != LLAMA_TOKEN_NULL) {
            return token;
        }
    }
    ++counts_.n_full;
    return full_vocabulary(logits, n_vocab, suppress_eog, eog);
}

// Rejection sampling, for chains that truncate nothing: each accepted draw is distributed as
// the chain's distribution restricted to the allowed tokens, which is what the full pass draws
// from. (With end-of-generation suppressed, a draw is over the other tokens; when the grammar
// allows nothing else, no draw is accepted and the full pass lets the end through.)
llama_token request_sampler::redraw(const float * logits, int32_t n_vocab, bool suppress_eog,
                                    const std::vector<int32_t> & eog) {
    for (int i = 0; i < k_redraws; ++i) {
        const llama_token pick = draw(logits, n_vocab, suppress_eog, eog);
        if (pick != LLAMA_TOKEN_NULL && grammar_allows(pick)) {
            ++counts_.n_by_rejection;
            return pick;
        }
    }
    return LLAMA_TOKEN_NULL;
}

// The grammar over the tokens of highest logit first (after bias and penalties, and with
// end-of-generation at -inf when suppressed: the full pass suppresses it too whenever the
// grammar allows anything else, and the walk only decides once it has found something else).
// LLAMA_TOKEN_NULL when the grammar allows no token.
llama_token request_sampler::walk_by_logit(const float * logits, int32_t n_vocab, bool suppress_eog,
                                           const std::vector<int32_t> & eog) {
    load(logits, n_vocab);
    if (suppress_eog) {
        suppress(eog);
    }
    llama_sampler_apply(adjust_, &cur_p_);       // per token: cur_ stays in token order
    order_.clear();
    float z_max = -INFINITY;
    for (const llama_token_data & d : cur_) {
        if (d.logit != -INFINITY) {
            order_.push_back(d);
            z_max = std::max(z_max, d.logit);
        }
    }
    const size_t n_finite = order_.size();
    // Masses relative to the highest logit, for the top_p rule, only when a chain has top_p.
    const bool needs_mass = filters_.top_p < 1.0f;
    double mass_all = 0.0, mass_checked = 0.0;
    if (needs_mass) {
        for (const llama_token_data & d : order_) {
            mass_all += std::exp((double) d.logit - z_max);
        }
    }
    found_.clear();
    seen_.allowed.clear();
    // Every token in order_[checked, head) ranks above every token in order_[head, n_finite). A
    // walk past its first round partitions the vocabulary once at the deepest point a sorted
    // round can reach, and its later rounds partition only inside that head.
    const size_t rest_at = n_finite / k_rest_at_once;
    size_t head = n_finite;
    bool head_bounded = false;
    for (size_t checked = 0, batch = k_first_batch; checked < n_finite; batch *= k_batch_growth) {
        // a long walk takes the rest at once: sorting it would cost more than it can save
        const size_t end = batch >= rest_at ? n_finite : std::min(checked + batch, n_finite);
        if (end < n_finite) {              // the last batch needs no order: nothing is left behind it
            if (checked > 0 && !head_bounded) {
                head_bounded = true;       // sorted rounds end below batch + batch < 2 * rest_at
                if (end <= 2 * rest_at && 2 * rest_at < n_finite) {
                    head = 2 * rest_at;
                    std::nth_element(order_.begin() + checked, order_.begin() + head, order_.end(), by_logit);
                }
            }
            if (end > head) {              // not with the constants above; exact if they change
                head = n_finite;
            }
            std::nth_element(order_.begin() + checked, order_.begin() + end, order_.begin() + head, by_logit);
            std::sort(order_.begin() + checked, order_.begin() + end, by_logit);
        }
        check_batch(checked, end);
        if (needs_mass) {
            for (size_t i = checked; i < end; ++i) {
                mass_checked += std::exp((double) order_[i].logit - z_max);
            }
        }
        checked = end;
        seen_.n_unchecked = n_finite - checked;
        seen_.max_unchecked = checked < n_finite ? order_[checked].logit : -INFINITY;
        if (!found_.empty() && needs_mass) {
            // the subtraction loses ~1e-16 of the whole; the margin covers it many times over
            const double rest = std::max(mass_all - mass_checked, 0.0) + mass_all * 1e-12;
            seen_.mass_unchecked = rest * std::exp((double) z_max - found_.front().logit);
        } else {
            seen_.mass_unchecked = INFINITY;
        }
        if (prefix_decides(filters_, seen_)) {
            return pick_among_found();
        }
    }
    // Every token with a chance was checked and refused. Without suppression the grammar allows
    // nothing; with it, the full pass lets end-of-generation through, so the walk does too.
    return suppress_eog ? pick_among_end(logits, n_vocab, eog) : LLAMA_TOKEN_NULL;
}

// The chain over the end-of-generation tokens the grammar allows (none: LLAMA_TOKEN_NULL).
llama_token request_sampler::pick_among_end(const float * logits, int32_t n_vocab, const std::vector<int32_t> & eog) {
    load(logits, n_vocab);
    llama_sampler_apply(adjust_, &cur_p_);
    order_.clear();
    for (int32_t t : eog) {
        order_.push_back(cur_[t]);
    }
    found_.clear();
    seen_.allowed.clear();
    check_batch(0, order_.size());
    return found_.empty() ? LLAMA_TOKEN_NULL : pick_among_found();
}

// The grammar over order_[begin, end), sorted by logit: the allowed ones join found_ (and their
// logits seen_.allowed), in that order. The grammar gets the batch in token id order: it reads
// each token's text from the vocabulary's tables, and in logit order those reads miss the cache
// (a walk over the whole vocabulary cost three times the full pass; in id order, about the same).
void request_sampler::check_batch(size_t begin, size_t end) {
    in_batch_.resize(cur_.size());
    for (size_t i = begin; i < end; ++i) {
        in_batch_[order_[i].id] = 1;
    }
    batch_.clear();
    for (const llama_token_data & d : cur_) {  // cur_ is in id order: a linear, sequential scan
        if (in_batch_[d.id]) {
            batch_.push_back(d);
            in_batch_[d.id] = 0;
        }
    }
    counts_.n_checked += (int64_t) batch_.size();
    llama_token_data_array arr = {batch_.data(), batch_.size(), -1, false};
    llama_sampler_apply(grammar_, &arr);
    const size_t n_before = found_.size();
    for (const llama_token_data & d : batch_) {
        if (d.logit != -INFINITY) {
            found_.push_back(d);
        }
    }
    std::sort(found_.begin() + n_before, found_.end(), by_logit);
    for (size_t i = n_before; i < found_.size(); ++i) {
        seen_.allowed.push_back(found_[i].logit);
    }
}

// The chain over the allowed tokens found, in token order as the full pass has them, so that
// the same random draw lands on the same token.
llama_token request_sampler::pick_among_found() {
    std::sort(found_.begin(), found_.end(),
              [](const llama_token_data & a, const llama_token_data & b) { return a.id < b.id; });
    cur_p_ = {found_.data(), found_.size(), -1, false};
    llama_sampler_apply(pick_, &cur_p_);
    const llama_token token = selected();
    cur_p_ = {cur_.data(), cur_.size(), -1, false};
    return token;
}

// The grammar speaks first, over the whole vocabulary.
llama_token request_sampler::full_vocabulary(const float * logits, int32_t n_vocab, bool suppress_eog,
                                             const std::vector<int32_t> & eog) {
    load(logits, n_vocab);
    llama_sampler_apply(grammar_, &cur_p_);
    if (suppress_eog && grammar_allows_other_than(eog)) {
        suppress(eog);
    }
    llama_sampler_apply(adjust_, &cur_p_);
    llama_sampler_apply(pick_, &cur_p_);
    return selected();
}

// A lazy grammar (a tool call's, under tool_choice auto) sleeps through the thinking, as in
// llama.cpp: a trigger word the model thinks about is not a call.
bool request_sampler::grammar_sleeps() const {
    return grammar_lazy_ && (thinking_ == THINKING_COUNTING || thinking_ == THINKING_FORCING);
}

namespace {

// Whether `text` ends inside a UTF-8 sequence (the forced tag waits for its end).
bool ends_mid_character(const std::string & text) {
    for (size_t back = 1; back <= 4 && back <= text.size(); ++back) {
        const unsigned char c = (unsigned char) text[text.size() - back];
        if ((c & 0xC0) != 0x80) {                 // the sequence's first byte
            const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            return need > back;
        }
    }
    return false;
}

// Whether `text` ends with the beginning of `tag` (the tag may be on its way).
bool ends_in_part_of(const std::string & text, const std::string & tag) {
    for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
        if (text.compare(text.size() - n, n, tag, 0, n) == 0) {
            return true;
        }
    }
    return false;
}

}  // namespace

// The thinking's state after `token`: IDLE -> COUNTING at the start tag (or from the start when
// the prompt opened it), COUNTING -> DONE at the end tag, or -> FORCING once `budget` thinking
// tokens are spent (and the text is neither mid-character nor part-way into the end tag: at
// most the tag's length in tokens more), FORCING -> DONE after the forced tag.
// The budget is for the whole answer: a second block starts with what the first one left.
void request_sampler::track_thinking(llama_token token) {
    if (thinking_ == THINKING_OFF) {
        return;
    }
    if (thinking_ == THINKING_FORCING) {
        if (++force_pos_ >= forced_.size()) {
            thinking_ = THINKING_DONE;
            tail_.clear();
        }
        return;
    }
    tail_ += token_piece(vocab_, token);
    const std::string & tag = thinking_ == THINKING_COUNTING ? end_tag_ : start_tag_;
    const size_t at = tag.empty() ? std::string::npos : tail_.find(tag);
    if (at != std::string::npos) {
        tail_.erase(0, at + tag.size());
        if (thinking_ == THINKING_COUNTING) {
            thinking_ = THINKING_DONE;
            return;
        }
        thinking_ = THINKING_COUNTING;
    } else if (thinking_ == THINKING_COUNTING) {
        ++n_thinking_;
    }
    if (thinking_ == THINKING_COUNTING && budget_ >= 0 && n_thinking_ >= budget_ &&
        !ends_mid_character(tail_) && !ends_in_part_of(tail_, end_tag_)) {
        thinking_ = THINKING_FORCING;
        force_pos_ = 0;
        return;
    }
    // keep what could still begin a tag
    const size_t keep = std::max(start_tag_.size(), end_tag_.size()) + 4;
    if (tail_.size() > keep) {
        tail_.erase(0, tail_.size() - keep);
    }
}

void request_sampler::accept(llama_token token) {
    track_thinking(token);
    // the token that ends the thinking wakes the grammar with it: it may hold the trigger's
    // first characters too ("><" of "</think><tool_call>")
    if (grammar_ != nullptr && !grammar_sleeps()) {
        llama_sampler_accept(grammar_, token);
    }
    llama_sampler_accept(adjust_, token);
    llama_sampler_accept(pick_, token);
}

namespace sampling_rows {

// std::max_element's value: the first maximum; a NaN never wins, except at token 0, which
// nothing then beats (the SIMD paths keep both: max(v, acc) keeps acc when v is NaN).
float max_scalar(const float * logits, int32_t n_vocab) {
    return *std::max_element(logits, logits + n_vocab);
}

void lanes_scalar(const float * logits, int32_t n_blocks, float max, float * lanes) {
    for (int32_t b = 0; b < n_blocks; ++b) {
        for (int32_t l = 0; l < k_lanes; ++l) {
            lanes[l] += exp_nonpositive(logits[b * k_lanes + l] - max);
        }
    }
}

int32_t above_scalar(const float * logits, int32_t from, int32_t n_vocab, float floor) {
    for (int32_t t = from; t < n_vocab; ++t) {
        if (!(logits[t] <= floor)) {          // a NaN gets in, as with the scalar test
            return t;
        }
    }
    return n_vocab;
}

}  // namespace sampling_rows

namespace {

using namespace sampling_rows;

// The widest path this CPU runs, chosen once.
const row_kernels & kernels_for_rows() {
    static const row_kernels chosen = [] {
#if defined(__x86_64__) && defined(__GNUC__)
        if (__builtin_cpu_supports("avx512f")) {
            return row_kernels{max_avx512, lanes_avx512, above_avx512};
        }
        if (__builtin_cpu_supports("avx2")) {
            return row_kernels{max_avx2, lanes_avx2, above_avx2};
        }
#endif
        return row_kernels{max_scalar, lanes_scalar, above_scalar};
    }();
    return chosen;
}

}  // namespace

// One pass for the maximum, one for the sum of exponentials (in 16 float lanes, added in double
// at the end), one for the top n (a short sorted list: a SIMD scan skips every logit not above
// its last entry, which is most of them). A prompt's log-probabilities run this once per prompt
// token, so it is kept to a few vectorized passes over the row (AVX-512 or AVX2 when the CPU has
// them, the same bits as the scalar path) with no allocation the size of the vocabulary.
logit_stats logit_stats_of(const float * logits, int32_t n_vocab, int32_t n_top) {
    const row_kernels & k = kernels_for_rows();
    const float max = k.max(logits, n_vocab);
    float lanes[k_lanes] = {};
    const int32_t n_blocks = n_vocab / k_lanes;
    k.lanes(logits, n_blocks, max, lanes);
    double sum = 0.0;
    for (int32_t i = n_blocks * k_lanes; i < n_vocab; ++i) {
        sum += exp_nonpositive(logits[i] - max);
    }
    for (float lane : lanes) {
        sum += lane;
    }
    logit_stats stats{max + (float) std::log(sum), {}};
    const int32_t n = std::min(std::max(n_top, 0), n_vocab);
    if (n > 0) {
        std::vector<std::pair<int32_t, float>> & top = stats.top;
        top.reserve(n + 1);
        for (int32_t t = 0; t < n_vocab; ++t) {
            if ((int32_t) top.size() == n) {             // full: only a higher logit gets in
                t = k.above(logits, t, n_vocab, top.back().second);   // ties keep the lower id
                if (t == n_vocab) {
                    break;
                }
            }
            const float logit = logits[t];
            auto at = std::upper_bound(top.begin(), top.end(), logit,
                                       [](float v, const std::pair<int32_t, float> & e) { return v > e.second; });
            top.insert(at, {t, logit});
            if ((int32_t) top.size() > n) {
                top.pop_back();
            }
        }
    }
    return stats;
}

int32_t candidates_needed(const sampling_params & p, int32_t n_eog) {
    if (!p.grammar.empty() || p.logprobs || p.n_top_logprobs > 0 || p.prompt_logprobs) {
        return -1;                      // the grammar's walk and the log-softmax read every token
    }
    if (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
        return -1;                      // a penalty may also raise a token (a negative one, or 1/x)
    }
    int64_t need = 0;
    if (p.temperature <= 0.0f) {
        need = 1;                       // greedy: the first highest
    } else if (p.top_k > 0) {
        need = p.top_k;                 // top-p, min-p, temperature, the draw: over the top k only
    } else {
        return -1;                      // a draw from every token
    }
    for (const auto & [token, bias] : p.logit_bias) {
        if (!(bias <= 0.0f)) {
            return -1;                  // raised (or NaN): any token may come from below
        }
        need += bias < 0.0f ? 1 : 0;
    }
    if (p.ignore_eos || p.min_tokens > 0) {
        need += std::max(n_eog, 0);     // set to -inf while suppressed
    }
    return need <= INT32_MAX ? (int32_t) need : -1;
}

std::string token_piece(const llama_vocab * vocab, int32_t token, bool special) {
    char buf[256];
    int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, special);
    if (n >= 0) {
        return std::string(buf, n);
    }
    std::string big(-n, '\0');
    n = llama_token_to_piece(vocab, token, big.data(), (int32_t) big.size(), 0, special);
    return n >= 0 ? big.substr(0, n) : std::string();
}
