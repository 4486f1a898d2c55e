// GET_ROWS on a Q8_0 weight in our buffer: a model's token embedding table when it is tied to
// the vocabulary projection (SmolLM2's 49,152 x 576). Served here, the table lives once, in our
// layout: llama.cpp reuses one tensor for the embedding and the projection when both land in
// the same buffer type, where a table left on the CPU made it load a second copy (~29 MB) for
// our matmul beside the file pages the CPU's copy reads.
//
// Each row is ggml's dequantize_row_q8_0 (w = q * d, one float multiply): bit for bit. Tables
// of the other types we repack (Q4_0, Q4_1, Q5_0, Q5_1; Q4_K and Q6_K, a Q4_K_M file's token
// embeddings) are served too: a row goes back to ggml's blocks and through ggml's own
// to_float, what ggml's GET_ROWS calls.
#pragma once

#include <cstdint>

#include "ggml.h"
#include "layout.h"

namespace stackd {

// Whether we can compute this GET_ROWS node given its table is in our buffer (type, shape).
bool can_serve_get_rows(const ggml_tensor *op);

// Row `row` of a repacked rows x k Q8_0 matrix, as k floats.
void dequantize_row_q8x8(const Q8x8Block *w, int64_t k, int64_t row, float *out);

// Thread ith of nth's share of dst = get_rows(src[0] (a repacked table), src[1] (row ids)).
void get_rows_share(ggml_tensor *dst, int ith, int nth);

}  // namespace stackd
