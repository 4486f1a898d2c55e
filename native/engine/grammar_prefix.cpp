#include "grammar_prefix.h"

#include <algorithm>
#include <cmath>

// Why running the chain on the allowed tokens of a prefix gives what the full-vocabulary pass
// gives. Let A be the tokens the grammar allows and z their logits after logit bias and
// penalties (both act on each token alone, so masking before or after them is the same). The
// walk checks tokens by descending z, so every unchecked token has z <= max_unchecked <= the
// last allowed one found: A sorted by z is F (the allowed tokens found) followed by R (the
// unchecked allowed ones, unknown). The full pass runs the chain on the vocabulary with every
// token outside A at -inf, which has no probability and is cut by every filter, so in effect on A:
//  - greedy takes A's first token, which is F's first as soon as F is not empty. On equal
//    logits greedy keeps the lowest id, and the walk orders equal logits by id, so an unchecked
//    token tied with F's first comes after it.
//  - top_k keeps A's first k: F's first k once F holds k tokens; R cannot matter.
//  - else R may join top_k's set. top_p keeps the shortest head whose probability, normalised
//    over that set, reaches p: the least j with cum_F(j) >= p * S, where S = S_F + S_R and S_R
//    lies between 0 and what the unchecked tokens could add. When both ends give the same j
//    inside F, the cut is known and R lies behind it.
//  - min_p keeps z >= z_first + ln(min_p), z_first being F's first. When every unchecked logit
//    is below that, no token of R survives whatever top_p kept, and the kept head is F's first
//    min(j, c), c being F's tokens above the threshold: known once the least possible j is >= c.
//  - temperature and the draw only see the tokens kept.
// With no truncating stage at all, every allowed token keeps its share of the draw, and only
// the whole vocabulary decides (sampling.cpp samples by rejection first for that case).
// Sums are compared with a relative margin, so that llama.cpp's float sums over F and over the
// whole vocabulary cannot land on two sides of a cut; inside the margin the walk goes on.

namespace {

constexpr double k_sum_margin = 1e-3;

// The number of tokens a top_p cut keeps: the least j with cum[j - 1] >= target.
size_t top_p_cut(const std::vector<double> & cum, double target) {
    return (size_t) (std::lower_bound(cum.begin(), cum.end(), target) - cum.begin()) + 1;
}

}  // namespace

bool prefix_decides(const pick_filters & filters, const prefix_seen & seen) {
    if (seen.allowed.empty()) {
        return false;
    }
    if (seen.n_unchecked == 0 || seen.max_unchecked == -INFINITY) {
        return true;                     // whatever is left has no probability
    }
    const size_t n_found = seen.allowed.size();
    if (filters.greedy || (filters.top_k > 0 && n_found >= (size_t) filters.top_k)) {
        return true;
    }
    const float z_first = seen.allowed.front();
    const float min_p_floor = filters.min_p > 0.0f ? z_first + logf(filters.min_p) : -INFINITY;  // as llama.cpp computes it
    const bool rest_under_min_p = seen.max_unchecked < min_p_floor;
    if (filters.top_p >= 1.0f) {
        return rest_under_min_p;
    }
    size_t n_rest = seen.n_unchecked;
    if (filters.top_k > 0) {
        n_rest = std::min(n_rest, (size_t) filters.top_k - n_found);
    }
    const double rest_mass = std::min(seen.mass_unchecked,
                                      (double) n_rest * std::exp((double) seen.max_unchecked - z_first));
    std::vector<double> cum(n_found);
    double mass = 0.0;
    for (size_t i = 0; i < n_found; ++i) {
        mass += std::exp((double) seen.allowed[i] - z_first);
        cum[i] = mass;
    }
    const size_t cut_least = top_p_cut(cum, filters.top_p * mass * (1.0 - k_sum_margin));
    const size_t cut_most  = top_p_cut(cum, filters.top_p * (mass + rest_mass) * (1.0 + k_sum_margin));
    if (cut_least == cut_most && cut_most <= n_found) {
        return true;
    }
    const size_t n_over_floor = (size_t) std::count_if(seen.allowed.begin(), seen.allowed.end(),
                                                       [&](float z) { return z >= min_p_floor; });
    return rest_under_min_p && cut_least >= n_over_floor;
}
