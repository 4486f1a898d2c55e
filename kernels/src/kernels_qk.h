// The K-quant matmul kernels (Q4_K, Q5_K, Q6_K): one entry point per SIMD path and type, every path
// computing the same arithmetic bit for bit, on the tile driver of the Q4_1 kernels (tiles.h).
//
// The arithmetic, for row r and token t, over super-blocks b in order (activations Q8_K:
// ActKBlock, d_a a float), with exact integers per super-block:
//   Q4_K  isum = sum over sub-blocks s of sc_s * dot_s      (dot_s: 32 weight x activation bytes)
//         msum = sum over s of m_s * bsum32_s
//         acc  = fma(d_w * d_a, (float) isum, acc)
//         acc  = fma(dmin_w * -d_a, (float) msum, acc)
//   Q5_K  as Q4_K, the weights with their fifth bit (0..31)
//   Q6_K  isum = sum over s of sc_s * (dot_s - 32 * bsum16_s)   (16 bytes a sub-block)
//         acc  = fma(d_w * d_a, (float) isum, acc)
// Integers are exact in any order (|isum| < 2^28), so each path splits them as its
// instructions like; the float operations are one fixed sequence per (row, token): batch-
// invariant and the same on every path. ggml's K-quant dot products use the same integers per
// super-block and keep eight float lanes (kernels/README.md bounds the difference).
#pragma once

#include <cstdint>

#include "cpu_features.h"
#include "layout_qk.h"

namespace stackd {

struct GemmOut;   // kernels.h: where a kernel writes

template <class Block>
using GemmKFn = void (*)(const Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                         const ActKBlock *act, int64_t n_tokens, const GemmOut &out);

struct KQuantKernels {
    GemmKFn<Q4Kx8Block> q4_k = nullptr;
    GemmKFn<Q6Kx8Block> q6_k = nullptr;
    GemmKFn<Q5Kx8Block> q5_k = nullptr;   // Q4_K's arithmetic, q with a fifth bit (layout_qk.h)
};

// gemm_qk_scalar.cpp; x86: gemm_qk_avx2.cpp, gemm_qk_avx512.cpp; aarch64: gemm_qk_neon.cpp.
KQuantKernels scalar_kquant_kernels();
KQuantKernels avx2_kquant_kernels();
KQuantKernels avx512_kquant_kernels();
KQuantKernels neon_kquant_kernels();
KQuantKernels kquant_kernels_for(Path path);

}  // namespace stackd
