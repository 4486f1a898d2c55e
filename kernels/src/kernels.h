// The matmul kernels: one entry point per SIMD path and weight type, all paths computing
// the same arithmetic.
//
// That arithmetic is ggml's own: the operations of ggml-cpu's x86 ggml_vec_dot_q4_1_q8_1
// (AVX2/AVX-512 build), in the same order, so our result is bit for bit ggml's. For row r
// and token t, over K-blocks b in order:
//     lane[c] = fma(d_w[r] * d_a[t], (float) isum_c, lane[c])   c = 0..7, isum_c the exact
//                                                               int32 dot of positions 4c..4c+3
//     summs   = fma(m_w[r], s_a[t], summs)
// then  result = ((lane0 + lane4) + (lane2 + lane6)) + ((lane1 + lane5) + (lane3 + lane7)) + summs.
// ggml keeps one row in a vector's lanes and reduces it at the end; we keep eight or sixteen
// rows in the lanes, one vector per c, so the unpacked weights and each broadcast activation
// serve all those rows at once. Each (row, token) result is a fixed sequence of IEEE
// operations that depends on neither the number of tokens in the call, nor the tile a token
// falls in, nor the thread that computes it: batch-invariant, and identical across paths.
#pragma once

#include <cstdint>

#include "cpu_features.h"
#include "layout.h"

namespace stackd {

// Rows [8*g_begin, min(8*g_end, rows)) of the product for n_tokens tokens.
// act: token t's K-blocks start at act + t*nb. dst: token t's output row starts at dst + t*dst_stride.
using GemmFn = void (*)(const Q4x8Block *w, int64_t nb, int64_t rows, int64_t g_begin,
                        int64_t g_end, const ActBlock *act, int64_t n_tokens, float *dst,
                        int64_t dst_stride);

void gemm_scalar(const Q4x8Block *, int64_t, int64_t, int64_t, int64_t, const ActBlock *, int64_t,
                 float *, int64_t);
void gemm_avx2(const Q4x8Block *, int64_t, int64_t, int64_t, int64_t, const ActBlock *, int64_t,
               float *, int64_t);
void gemm_avx512(const Q4x8Block *, int64_t, int64_t, int64_t, int64_t, const ActBlock *, int64_t,
                 float *, int64_t);

// Q8_0 weights (the vocabulary projection of a model with tied Q8_0 embeddings): ggml's x86
// ggml_vec_dot_q8_0_q8_0 and llamafile's tinyBLAS_Q0_AVX (which ggml takes for 2 tokens or
// more) compute the same thing, and so do we: for row r and token t, over K-blocks b in order,
//     lane[c] = fma(d_w[r] * d_a[t], (float) isum_c, lane[c])   c = 0..7
// then result = ((lane0 + lane4) + (lane2 + lane6)) + ((lane1 + lane5) + (lane3 + lane7)).
// Activations are Q8_0, which quantizes exactly as Q8_1 does (same q, same fp16 d): ActBlock.
using GemmQ8Fn = void (*)(const Q8x8Block *w, int64_t nb, int64_t rows, int64_t g_begin,
                          int64_t g_end, const ActBlock *act, int64_t n_tokens, float *dst,
                          int64_t dst_stride);

void gemm_q8_0_scalar(const Q8x8Block *, int64_t, int64_t, int64_t, int64_t, const ActBlock *,
                      int64_t, float *, int64_t);
void gemm_q8_0_avx2(const Q8x8Block *, int64_t, int64_t, int64_t, int64_t, const ActBlock *,
                    int64_t, float *, int64_t);
void gemm_q8_0_avx512(const Q8x8Block *, int64_t, int64_t, int64_t, int64_t, const ActBlock *,
                      int64_t, float *, int64_t);

// A path's kernels, one per weight type we repack.
struct Kernels {
    GemmFn q4_1;
    GemmQ8Fn q8_0;
};

Kernels kernels_for(Path path);

// One row of k floats -> k/32 ActBlocks, bit for bit as ggml's quantize_row_q8_1 (x86).
void quantize_row(const float *x, int64_t k, ActBlock *out);

// Writes the valid rows of a group's 8 results (the last group may be partial).
inline void store_group(float *dst, const float *acc8, int64_t row0, int64_t rows) {
    const int64_t n = rows - row0 < kRowsPerGroup ? rows - row0 : kRowsPerGroup;
    for (int64_t r = 0; r < n; r++) dst[row0 + r] = acc8[r];
}

}  // namespace stackd
