// The AVX2 paths (with FMA and F16C), Q4_1 and Q8_0. Compiled for those instructions by the target pragma
// below, not by a build flag, so the library still loads on any x86-64; cpu_features.cpp
// decides at run time whether this code may run.
#include <immintrin.h>

#include <cstring>

#include "kernels.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "tiles.h"

namespace stackd {

namespace {

// Tokens per tile: a token needs an integer and a float accumulator; with the two unpacked
// weight vectors of one step and the constants, four tokens fit the 16 registers.
constexpr int kTile = 4;

inline __m256i broadcast_quad(const ActBlock &a, int chunk) {
    int32_t quad;
    std::memcpy(&quad, a.q + 4 * chunk, sizeof quad);
    return _mm256_set1_epi32(quad);
}

// One group (8 rows) against TT consecutive tokens over all K-blocks; out receives TT x 8
// floats. Each 32-byte step of the block's weights is unpacked once and used by every token.
template <int TT>
inline void group_tile(const Q4x8Block *wg, int64_t nb, const ActBlock *act, float *out) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TT];
    for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead(wg, nb, b);
        const Q4x8Block &blk = wg[b];
        // vpmaddubsw: u8 x s8 pairs into int16 lanes (|2 x 15 x 127| = 3810). Eight of those
        // added per lane stay within 30480, exact in int16, so one vpmaddwd per token and
        // block turns the lanes into each row's int32 sum.
        __m256i pairs[TT];
        for (int t = 0; t < TT; t++) pairs[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(blk.qs + 32 * j));
            const __m256i lo = _mm256_and_si256(p, low), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
            for (int t = 0; t < TT; t++) {
                const ActBlock &a = act[t * nb + b];
                pairs[t] = _mm256_add_epi16(pairs[t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_quad(a, j)),
                                                                       _mm256_maddubs_epi16(hi, broadcast_quad(a, j + 4))));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk.d));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk.m));
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[t * nb + b];
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.d));
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs[t], ones)), acc[t]);
            acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) _mm256_storeu_ps(out + 8 * t, acc[t]);
}

// ---- Q8_0 ------------------------------------------------------------------------------------
// Without VNNI the u8 x s8 product is vpmaddubsw, whose int16 pair sums would overflow on
// q + 128 (2 x 255 x 127), so this path takes the weights back to signed bytes and uses ggml's
// own sign trick: |q_w| times q_a carrying q_w's sign (pairs stay within 2 x 128 x 127). The integers are exact either way; float arithmetic as kernels.h.

// One group (8 rows) against TT tokens over all K-blocks; out receives TT x 8 floats. Each of
// the block's eight 32-byte steps is loaded and made signed once for every token.
template <int TT>
inline void group_tile(const Q8x8Block *wg, int64_t nb, const ActBlock *act, float *out) {
    const __m256i offset = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TT];
    for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead(wg, nb, b);
        const Q8x8Block &blk = wg[b];
        __m256i isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk.qs + 32 * c)), offset);
            const __m256i magnitude = _mm256_sign_epi8(q, q);
            for (int t = 0; t < TT; t++) {
                const __m256i signed_a = _mm256_sign_epi8(broadcast_quad(act[t * nb + b], c), q);
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_a), ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk.d));
        for (int t = 0; t < TT; t++) {
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(act[t * nb + b].d));
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) _mm256_storeu_ps(out + 8 * t, acc[t]);
}

}  // namespace

// Every group of the weights against every token, a group at a time.
template <class Block>
void gemm_avx2(const Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
               const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    tiles::for_groups<kTile>(g_begin, g_end, rows, n_tokens, dst, dst_stride,
                             [=](auto tt, int64_t g, int64_t t, float *out) __attribute__((always_inline)) {
                                 group_tile<decltype(tt)::value>(w + g * nb, nb, act + t * nb, out);
                             });
}

template void gemm_avx2(const Q4x8Block *, int64_t, int64_t, int64_t, int64_t, const ActBlock *, int64_t, float *,
                        int64_t);
template void gemm_avx2(const Q8x8Block *, int64_t, int64_t, int64_t, int64_t, const ActBlock *, int64_t, float *,
                        int64_t);

}  // namespace stackd

#pragma GCC pop_options
