// GCC 12 flags its own _mm512 intrinsics as maybe-uninitialized; a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The Q8_0 AVX-512 path: the weights are stored as q + 128 (layout.h), the unsigned operand
// of VNNI's vpdpbusd, and each dot product's accumulator starts at -128 times the sum of the
// four activation bytes it multiplies, so the int32 result is exactly sum(q_w * q_a).
// Two row groups fill a 512-bit vector (16 rows); an odd last group runs at 256 bits.
// Lane arithmetic is ggml's (kernels.h), the same as the scalar path's.
#include <immintrin.h>

#include <vector>

#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "avx512_lanes.h"

namespace stackd {

namespace {

using namespace avx512;

constexpr int kTile = 2;  // 8 weight vectors + 8 accumulators a token + temps in 32 registers

struct Corrections {
    int32_t c[8];  // -128 * (sum of the activation bytes 4c .. 4c+3 of one block)
};

// One token-block's corrections: vpdpbusd of 128 (unsigned) against the activation bytes.
void correct(const ActBlock *act, int64_t count, Corrections *out) {
    const __m256i offset = _mm256_set1_epi8((char)0x80);
    for (int64_t i = 0; i < count; i++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)act[i].q);
        const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), offset, q);
        _mm256_storeu_si256((__m256i *)out[i].c, _mm256_sub_epi32(_mm256_setzero_si256(), sums));
    }
}




// Two groups (16 rows) against TT tokens; out receives TT x 16 floats.
template <int TT>
inline void pair_tile(const Q8x8Block *w0, const Q8x8Block *w1, int64_t nb, const ActBlock *act,
                      const Corrections *corr, float *out) {
    __m512 lane[TT][8];
    for (int t = 0; t < TT; t++)
        for (int c = 0; c < 8; c++) lane[t][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512 dw = pair_fp16(w0[b].d, w1[b].d);
        __m512i u[8];
        for (int c = 0; c < 8; c++) u[c] = pair256(w0[b].qs + 32 * c, w1[b].qs + 32 * c);
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[t * nb + b];
            const Corrections &k = corr[t * nb + b];
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d));
            for (int c = 0; c < 8; c++) {
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_set1_epi32(k.c[c]), u[c],
                                                        _mm512_set1_epi32(quad(a, c)));
                lane[t][c] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), lane[t][c]);
            }
        }
    }
    for (int t = 0; t < TT; t++) _mm512_storeu_ps(out + 16 * t, reduce_lanes(lane[t]));
}

// One group (8 rows) against TT tokens at 256 bits; out receives TT x 8 floats.
template <int TT>
inline void group_tile(const Q8x8Block *wg, int64_t nb, const ActBlock *act, const Corrections *corr,
                       float *out) {
    __m256 lane[TT][8];
    for (int t = 0; t < TT; t++)
        for (int c = 0; c < 8; c++) lane[t][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wg[b].d));
        __m256i u[8];
        for (int c = 0; c < 8; c++) u[c] = _mm256_loadu_si256((const __m256i *)(wg[b].qs + 32 * c));
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[t * nb + b];
            const Corrections &k = corr[t * nb + b];
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.d));
            for (int c = 0; c < 8; c++) {
                const __m256i dot = _mm256_dpbusd_epi32(_mm256_set1_epi32(k.c[c]), u[c],
                                                        _mm256_set1_epi32(quad(a, c)));
                lane[t][c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), lane[t][c]);
            }
        }
    }
    for (int t = 0; t < TT; t++) _mm256_storeu_ps(out + 8 * t, reduce_lanes(lane[t]));
}

void run_pair(const Q8x8Block *w, int64_t nb, int64_t rows, int64_t g, const ActBlock *act,
              const Corrections *corr, int64_t n_tokens, float *dst, int64_t dst_stride) {
    alignas(64) float out[kTile * 16];
    const Q8x8Block *w0 = w + g * nb, *w1 = w + (g + 1) * nb;
    int64_t t = 0;
    for (; t + kTile <= n_tokens; t += kTile) {
        pair_tile<kTile>(w0, w1, nb, act + t * nb, corr + t * nb, out);
        for (int i = 0; i < kTile; i++) {
            float *row = dst + (t + i) * dst_stride;
            store_group(row, out + 16 * i, g * kRowsPerGroup, rows);
            store_group(row, out + 16 * i + 8, (g + 1) * kRowsPerGroup, rows);
        }
    }
    for (; t < n_tokens; t++) {
        pair_tile<1>(w0, w1, nb, act + t * nb, corr + t * nb, out);
        store_group(dst + t * dst_stride, out, g * kRowsPerGroup, rows);
        store_group(dst + t * dst_stride, out + 8, (g + 1) * kRowsPerGroup, rows);
    }
}

void run_single(const Q8x8Block *w, int64_t nb, int64_t rows, int64_t g, const ActBlock *act,
                const Corrections *corr, int64_t n_tokens, float *dst, int64_t dst_stride) {
    alignas(32) float out[kTile * 8];
    const Q8x8Block *wg = w + g * nb;
    int64_t t = 0;
    for (; t + kTile <= n_tokens; t += kTile) {
        group_tile<kTile>(wg, nb, act + t * nb, corr + t * nb, out);
        for (int i = 0; i < kTile; i++)
            store_group(dst + (t + i) * dst_stride, out + 8 * i, g * kRowsPerGroup, rows);
    }
    for (; t < n_tokens; t++) {
        group_tile<1>(wg, nb, act + t * nb, corr + t * nb, out);
        store_group(dst + t * dst_stride, out, g * kRowsPerGroup, rows);
    }
}

}  // namespace

void gemm_q8_0_avx512(const Q8x8Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                      const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    // Each thread derives the corrections of every token-block it reads: one vpdpbusd per
    // block, against 16 rows x 8 for each block of the weights it multiplies.
    thread_local std::vector<Corrections> corr;
    if (corr.size() < (size_t)(n_tokens * nb)) corr.resize(n_tokens * nb);
    correct(act, n_tokens * nb, corr.data());
    int64_t g = g_begin;
    for (; g + 2 <= g_end; g += 2) run_pair(w, nb, rows, g, act, corr.data(), n_tokens, dst, dst_stride);
    if (g < g_end) run_single(w, nb, rows, g, act, corr.data(), n_tokens, dst, dst_stride);
}

}  // namespace stackd

#pragma GCC pop_options
