// The AVX2 path (with FMA and F16C). Compiled for those instructions by the target pragma
// below, not by a build flag, so the library still loads on any x86-64; cpu_features.cpp
// decides at run time whether this code may run.
#include <immintrin.h>

#include <cstring>

#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace stackd {

namespace {

constexpr int kTile = 1;  // 9 accumulators a token (kernels.h) fill the 16 registers already

inline __m256i broadcast_quad(const ActBlock &a, int chunk) {
    int32_t quad;
    std::memcpy(&quad, a.q + 4 * chunk, sizeof quad);
    return _mm256_set1_epi32(quad);
}

// Accumulates one group (8 rows) against TT consecutive tokens over all K-blocks;
// out receives TT x 8 floats.
template <int TT>
inline void group_tile(const Q4x8Block *wg, int64_t nb, const ActBlock *act, float *out) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 lane[TT][8], summs[TT];
    for (int t = 0; t < TT; t++) {
        for (int c = 0; c < 8; c++) lane[t][c] = _mm256_setzero_ps();
        summs[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const Q4x8Block &blk = wg[b];
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk.d));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk.m));
        __m256i u[8];
        for (int j = 0; j < 4; j++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(blk.qs + 32 * j));
            u[j] = _mm256_and_si256(p, low);
            u[j + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
        }
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[t * nb + b];
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.d));
            for (int c = 0; c < 8; c++) {
                // u8 x s8 pairs into int16 (|2 x 15 x 127| fits), pairs of those into int32.
                const __m256i dot = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(u[c], broadcast_quad(a, c)), ones);
                lane[t][c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), lane[t][c]);
            }
            summs[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s), summs[t]);
        }
    }
    for (int t = 0; t < TT; t++) {
        const __m256 *l = lane[t];
        const __m256 sum = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
            _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
        _mm256_storeu_ps(out + 8 * t, _mm256_add_ps(sum, summs[t]));
    }
}

}  // namespace

void gemm_avx2(const Q4x8Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
               const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    alignas(32) float out[kTile * 8];
    for (int64_t g = g_begin; g < g_end; g++) {
        const Q4x8Block *wg = w + g * nb;
        int64_t t = 0;
        for (; t + kTile <= n_tokens; t += kTile) {
            group_tile<kTile>(wg, nb, act + t * nb, out);
            for (int i = 0; i < kTile; i++)
                store_group(dst + (t + i) * dst_stride, out + 8 * i, g * kRowsPerGroup, rows);
        }
        for (; t < n_tokens; t++) {
            group_tile<1>(wg, nb, act + t * nb, out);
            store_group(dst + t * dst_stride, out, g * kRowsPerGroup, rows);
        }
    }
}

}  // namespace stackd

#pragma GCC pop_options
