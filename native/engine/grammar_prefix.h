// When the grammar rejects the sampler's pick, which tokens must the grammar see before the
// pick can be taken again without changing its outcome? This file holds the rule; sampling.cpp
// walks the vocabulary by descending logit and asks it after each batch of grammar checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

// The truncating stages of a request's pick chain, in chain order (llama.cpp's semantics:
// top_k <= 0, top_p >= 1 and min_p <= 0 are off). Temperature and the final draw come after
// them and only see the tokens they keep.
struct pick_filters {
    bool    greedy = false;
    int32_t top_k  = 0;
    float   top_p  = 1.0f;
    float   min_p  = 0.0f;

    // No stage truncates: the draw is over every allowed token, so no prefix can decide it.
    bool keeps_everything() const { return !greedy && top_k <= 0 && top_p >= 1.0f && min_p <= 0.0f; }
};

// What a walk down the vocabulary (by logit after bias and penalties, descending) has seen.
struct prefix_seen {
    std::vector<float> allowed;   // the logits of the allowed tokens found so far, descending
    size_t n_unchecked  = 0;      // tokens with a finite logit not checked yet
    float  max_unchecked = 0.0f;  // the highest logit among them (at most allowed.back())
    double mass_unchecked = 0.0;  // an upper bound of sum(exp(z - allowed[0])) over them
};

// True when the tokens the chain keeps (and so the drawn token, for the same random draw) are
// the same whichever of the unchecked tokens the grammar would allow: running the chain on the
// allowed tokens found is then the same as running it on the grammar-masked vocabulary.
bool prefix_decides(const pick_filters & filters, const prefix_seen & seen);
