#include "ngram_draft.h"

#include <algorithm>

std::vector<token_t> ngram_draft(const std::vector<token_t> & cache, token_t last, int32_t n_max) {
    std::vector<token_t> draft;
    if (n_max <= 0) {
        return draft;
    }
    const int32_t len = (int32_t) cache.size() + 1;
    auto at = [&](int32_t i) { return i == len - 1 ? last : cache[i]; };
    for (int32_t n = std::min(k_draft_ngram_max, len - 1); n >= k_draft_ngram_min; --n) {
        // the latest start i < len - n whose n tokens equal the history's last n
        for (int32_t i = len - n - 1; i >= 0; --i) {
            int32_t k = 0;
            while (k < n && at(i + k) == at(len - n + k)) {
                ++k;
            }
            if (k < n) {
                continue;
            }
            for (int32_t j = i + n; j < len && (int32_t) draft.size() < n_max; ++j) {
                draft.push_back(at(j));
            }
            return draft;
        }
    }
    return draft;
}
