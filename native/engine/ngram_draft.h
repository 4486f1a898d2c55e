// Draftless speculative decoding's drafter: prompt lookup. A sequence that copies from its
// prompt (extracts, rewrites, fills JSON, edits code) tends to go on the way the text it copies
// went on, so the tokens that followed the latest earlier occurrence of its last n tokens are a
// guess at its next ones, made with no draft model. The engine verifies the guess in the batch
// (engine_generate.cpp, sample_drafted), so a wrong guess costs compute, never correctness.
#pragma once

#include <cstdint>
#include <vector>

#include "plan.h"

// The n-gram lengths tried, longest first: a longer match is a more specific context. One
// token alone matches too often to be worth a draft on a compute-bound CPU.
constexpr int32_t k_draft_ngram_max = 3;
constexpr int32_t k_draft_ngram_min = 2;

// Up to `n_max` tokens that followed the latest earlier occurrence of the last n tokens of
// `history` (`cache` followed by `last`), n from k_draft_ngram_max down to k_draft_ngram_min;
// empty when none occurs.
std::vector<token_t> ngram_draft(const std::vector<token_t> & cache, token_t last, int32_t n_max);
