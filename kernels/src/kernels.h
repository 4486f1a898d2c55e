// The matmul kernels: one entry point per SIMD path and weight type, all paths computing
// the same arithmetic, bit for bit.
//
// That arithmetic, for row r and token t, over K-blocks b in order (Q4_1: w = d*q + m):
//     isum = the exact int32 dot product of the block's 32 weights and activation bytes
//            (Q4_0: q - 8, Q5_0: q - 16, the others: q as stored in ggml's block)
//     acc  = fma(d_w[r] * d_a[t], (float) isum, acc)
//     acc  = fma(m_w[r], s_a[t], acc)                   (Q4_1 and Q5_1 only)
// and the result is acc. The integer sums are exact whatever order a path adds them in, so
// each path is free to split them across registers; the float operations are the same
// sequence on every path. ggml's own x86 dot products keep eight float partial sums per row
// (one per four positions) and add them at the end: the same terms, summed in a different
// order, so our result is within float rounding of ggml's (kernels/README.md states the
// bound the op tests check). Per block that is 8x fewer float conversions and multiply-adds,
// which is what the tiles below spend their time on.
//
// We keep eight or sixteen rows in a vector's lanes, so the unpacked weights and each
// broadcast activation serve all those rows at once. Each (row, token) result is a fixed
// sequence of IEEE operations that depends on neither the number of tokens in the call, nor
// the tile a token falls in, nor the thread that computes it: batch-invariant, and identical
// across paths.
#pragma once

#include <cstdint>
#include <cstring>

#include "attention.h"
#include "cpu_features.h"
#include "kernels_qk.h"
#include "layout.h"

namespace stackd {

// Where a kernel writes, and which of the two forms of the arithmetic it computes.
//
// The plain form (chunk 0) is the one above. The chunked form (chunk > 0) runs the same float
// sequence over each run of `chunk` K-blocks from zero, adds those runs' sums in double in
// order, and rounds once to float. It is for the products a tensor split cuts by input columns
// (attn_output, ffn_down; docs/cluster.md, "Answers"): a cut on a run's boundary leaves every
// run whole on one node, each node adds its runs in double and the partial sums are added in
// double in node order, so a split's sum differs from one node's only by double rounding
// (about 1e-16) and rounds to the same float but on a boundary that close. The plain form's one
// float chain cannot be cut that way: its rounding depends on where the chain starts.
struct GemmOut {
    float *f32 = nullptr;      // token t's row of results starts at f32 + t*stride
    double *f64 = nullptr;     // chunked form only, optional: the same rows before rounding
    int64_t stride = 0;        // elements from one token's row to the next (both arrays)
    int64_t chunk = 0;         // K-blocks a float run; 0: the plain form
};

// A kernel: rows [8*g_begin, min(8*g_end, rows)) of the product for n_tokens tokens, the
// weights repacked as Block (Q4x8Block, Q8x8Block). act: token t's K-blocks start at act + t*nb.
template <class Block>
using GemmFn = void (*)(const Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                        const ActBlock *act, int64_t n_tokens, const GemmOut &out);

// A path's kernels, one per weight type we repack. Q8_0 weights (the vocabulary projection of
// a model with tied Q8_0 embeddings) take the same arithmetic without the minimum term, and
// the same activations: Q8_0 quantizes exactly as Q8_1 does (same q, same fp16 d).
struct Kernels {
    GemmFn<Q4x8Block> q4_1;
    GemmFn<Q8x8Block> q8_0;
    GemmFn<Q40x8Block> q4_0;   // Q4_0 and Q5_0: the same activations, each block's integer
    GemmFn<Q50x8Block> q5_0;   // offset by -8 or -16 x the activation sum (layout.h)
    GemmFn<Q51x8Block> q5_1;   // Q4_1's arithmetic on 5-bit q
    KQuantKernels kquants{};   // Q4_K, Q6_K (kernels_qk.h): filled by kernels_for
    AttendFn attend = nullptr; // decode attention (attention.h): filled by kernels_for
};

// Each path's kernels (gemm_scalar.cpp; x86: gemm_avx2.cpp, gemm_avx512.cpp; aarch64:
// gemm_neon.cpp, gemm_neon_i8mm.cpp), and the one for a path. Only the build's own
// architecture's are defined (kernels_for asks for no other).
Kernels scalar_kernels();
Kernels avx2_kernels();
Kernels avx512_kernels();
Kernels neon_kernels();
Kernels neon_i8mm_kernels();
Kernels kernels_for(Path path);

// One row of k floats -> k/32 ActBlocks, bit for bit as ggml's quantize_row_q8_1 (x86).
void quantize_row(const float *x, int64_t k, ActBlock *out);

// Activation bytes 4*chunk .. 4*chunk+3 of a block as one int32, to broadcast.
inline int32_t quad(const ActBlock &a, int chunk) {
    int32_t v;
    std::memcpy(&v, a.q + 4 * chunk, sizeof v);
    return v;
}

// Writes the valid rows of a group's 8 results (the last group may be partial). A whole group
// is one fixed-size copy, which the compiler makes one vector store.
template <class T>
inline void store_group(T *dst, const T *acc8, int64_t row0, int64_t rows) {
    if (rows - row0 >= kRowsPerGroup) {
        std::memcpy(dst + row0, acc8, sizeof(T) * kRowsPerGroup);
        return;
    }
    for (int64_t r = 0; r < rows - row0; r++) dst[row0 + r] = acc8[r];
}

}  // namespace stackd
