// GCC 12 flags its own _mm512 intrinsics as maybe-uninitialized; a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The AVX-512 paths, Q4_1 and Q8_0: VNNI's vpdpbusd does the u8 x s8 dot of four positions per row in one
// instruction, adding into an int32 lane per row; eight of them make a block's exact integer
// sum. Two row groups fill a 512-bit vector (16 rows); below 4 tokens, and for an odd last
// group, one group runs at 256 bits (AVX512VL; tiles::for_group_pairs). Compiled for these instructions by the target pragma, chosen at run time
// (cpu_features.cpp). Float arithmetic as every other path (kernels.h).
#include <immintrin.h>

#include <vector>

#include "kernels.h"
#include "prefetch.h"  // before the target pragma: one baseline definition for every file

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "avx512_lanes.h"

namespace stackd {

namespace {

using namespace avx512;

// Tokens per tile: the eight unpacked weight vectors are reused by each, and a token needs one
// accumulator, so eight tokens fit the 32 registers with the temporaries.
constexpr int kTile = 8;

// Two groups (16 rows) against TT tokens; out receives TT x 16 floats.
template <int TT>
inline void pair_tile(const Q4x8Block *w0, const Q4x8Block *w1, int64_t nb, const ActBlock *act,
                      float *out) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[TT];
    for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead(w0, nb, b);
        prefetch_ahead(w1, nb, b);
        __m512i u[8];
#pragma GCC unroll 4  // kept in registers: a loop here went through the stack
        for (int j = 0; j < 4; j++) {
            const __m512i p = pair256(w0[b].qs + 32 * j, w1[b].qs + 32 * j);
            u[j] = _mm512_and_si512(p, low);
            u[j + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
        }
        const __m512 dw = pair_fp16(w0[b].d, w1[b].d);
        const __m512 mw = pair_fp16(w0[b].m, w1[b].m);
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[t * nb + b];
            const __m512i isum = block_dot(u, a);
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d));
            acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[t]);
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) _mm512_storeu_ps(out + 16 * t, acc[t]);
}

// One group (8 rows) against TT tokens at 256 bits; out receives TT x 8 floats.
template <int TT>
inline void group_tile(const Q4x8Block *wg, int64_t nb, const ActBlock *act, float *out) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[TT];
    for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead(wg, nb, b);
        __m256i u[8];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(wg[b].qs + 32 * j));
            u[j] = _mm256_and_si256(p, low);
            u[j + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wg[b].d));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wg[b].m));
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[t * nb + b];
            const __m256i isum = block_dot(u, a);
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.d));
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[t]);
            acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) _mm256_storeu_ps(out + 8 * t, acc[t]);
}

// ---- Q8_0 ------------------------------------------------------------------------------------
// The weights are stored as q + 128 (layout.h), the unsigned operand of VNNI's vpdpbusd, and
// each block's integer sum starts at -128 times the sum of the block's 32 activation bytes, so
// it ends exactly at sum(q_w * q_a).

// -128 x (the sum of a token-block's 32 activation bytes): vpdpbusd of 128 (unsigned)
// against the bytes, then the eight lanes added.
void correct(const ActBlock *act, int64_t count, int32_t *out) {
    const __m256i offset = _mm256_set1_epi8((char)0x80);
    for (int64_t i = 0; i < count; i++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)act[i].q);
        const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), offset, q);
        const __m128i half = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
        const __m128i quarter = _mm_add_epi32(half, _mm_unpackhi_epi64(half, half));
        out[i] = -(_mm_cvtsi128_si32(quarter) + _mm_extract_epi32(quarter, 1));
    }
}

// Two groups (16 rows) against TT tokens; out receives TT x 16 floats.
template <int TT>
inline void pair_tile(const Q8x8Block *w0, const Q8x8Block *w1, int64_t nb, const ActBlock *act,
                      const int32_t *corr, float *out) {
    __m512 acc[TT];
    for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead(w0, nb, b);
        prefetch_ahead(w1, nb, b);
        __m512i u[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) u[c] = pair256(w0[b].qs + 32 * c, w1[b].qs + 32 * c);
        const __m512 dw = pair_fp16(w0[b].d, w1[b].d);
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[t * nb + b];
            const __m512i isum = block_dot(u, a, _mm512_set1_epi32(corr[t * nb + b]));
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d));
            acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) _mm512_storeu_ps(out + 16 * t, acc[t]);
}

// One group (8 rows) against TT tokens at 256 bits; out receives TT x 8 floats.
template <int TT>
inline void group_tile(const Q8x8Block *wg, int64_t nb, const ActBlock *act, const int32_t *corr,
                       float *out) {
    __m256 acc[TT];
    for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead(wg, nb, b);
        __m256i u[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) u[c] = _mm256_loadu_si256((const __m256i *)(wg[b].qs + 32 * c));
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wg[b].d));
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[t * nb + b];
            const __m256i isum = block_dot(u, a, _mm256_set1_epi32(corr[t * nb + b]));
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.d));
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) _mm256_storeu_ps(out + 8 * t, acc[t]);
}

}  // namespace

void gemm_avx512(const Q4x8Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                 const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    tiles::for_group_pairs<kTile>(
        g_begin, g_end, rows, n_tokens, dst, dst_stride,
        [=](auto tt, int64_t g, int64_t t, float *out) __attribute__((always_inline)) {
            pair_tile<decltype(tt)::value>(w + g * nb, w + (g + 1) * nb, nb, act + t * nb, out);
        },
        [=](auto tt, int64_t g, int64_t t, float *out) __attribute__((always_inline)) {
            group_tile<decltype(tt)::value>(w + g * nb, nb, act + t * nb, out);
        });
}

void gemm_q8_0_avx512(const Q8x8Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                      const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    // Each thread derives the corrections of every token-block it reads: one vpdpbusd per
    // block, against 16 rows x 8 for each block of the weights it multiplies.
    thread_local std::vector<int32_t> corr;
    if (corr.size() < (size_t)(n_tokens * nb)) corr.resize(n_tokens * nb);
    correct(act, n_tokens * nb, corr.data());
    const int32_t *c = corr.data();
    tiles::for_group_pairs<kTile>(
        g_begin, g_end, rows, n_tokens, dst, dst_stride,
        [=](auto tt, int64_t g, int64_t t, float *out) __attribute__((always_inline)) {
            pair_tile<decltype(tt)::value>(w + g * nb, w + (g + 1) * nb, nb, act + t * nb, c + t * nb, out);
        },
        [=](auto tt, int64_t g, int64_t t, float *out) __attribute__((always_inline)) {
            group_tile<decltype(tt)::value>(w + g * nb, nb, act + t * nb, c + t * nb, out);
        });
}

}  // namespace stackd

#pragma GCC pop_options
