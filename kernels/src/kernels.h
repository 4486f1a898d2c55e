// The matmul kernels: one entry point per SIMD path, all computing the same arithmetic.
//
// For row r and token t, every path accumulates, block by block in K order,
//     acc = fma(d_w[r] * d_a[t], (float) isum,  acc)     isum: exact int32 dot of the block
//     acc = fma(m_w[r],          s_a[t],        acc)
// starting from 0. Each (row, token) result is therefore a fixed sequence of IEEE operations
// that depends on neither the number of tokens in the call, nor the tile a token falls in,
// nor the thread that computes it: batch-invariant, and identical across paths.
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

GemmFn gemm_for(Path path);

// One row of k floats -> k/32 ActBlocks, bit for bit as ggml's quantize_row_q8_1 (x86).
void quantize_row(const float *x, int64_t k, ActBlock *out);

// Writes the valid rows of a group's 8 results (the last group may be partial).
inline void store_group(float *dst, const float *acc8, int64_t row0, int64_t rows) {
    const int64_t n = rows - row0 < kRowsPerGroup ? rows - row0 : kRowsPerGroup;
    for (int64_t r = 0; r < n; r++) dst[row0 + r] = acc8[r];
}

}  // namespace stackd
