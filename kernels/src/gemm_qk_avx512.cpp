// The K-quant AVX-512 VNNI bodies, Q4_K and Q6_K, on the tile driver every path runs
// (tiles.h): vpdpbusd adds a sub-block's u8 x s8 products into one int32 lane per row, a
// vpmulld by the row's sub-block scale makes sc_s * dot_s, and vpdpwssd adds Q4_K's
// minimum terms. One row group (8 rows, 256-bit lanes with AVX512VL) a tile, eight tokens.
// Chosen at run time (cpu_features.cpp). Integer and float arithmetic as kernels_qk.h.
#include <immintrin.h>

#include "kernels.h"
#include "kernels_qk.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "tiles.h"

namespace stackd {

namespace {

struct Avx512K {
    using Act = ActKBlock;
    static constexpr int kTile = 8;
    static constexpr int64_t kPairsFrom = 0;
    template <int TT, int NG> using Acc = __m256[TT];
};

inline __m256 fp16x8(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }
inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
inline __m128i load8(const void *p) { return _mm_loadl_epi64((const __m128i *)p); }

// Sub-block s's eight 6-bit scales (minimums: kMins) as bytes, one per row (layout_qk.h).
enum Q4KField { kScales, kMins };
template <Q4KField kField>
inline __m128i q4k_bytes(const Q4Kx8Block *w, int s) {
    const int k = s % 4, upper = s / 4;
    const __m128i lo = _mm_loadl_epi64((const __m128i *)(kField == kScales ? w->sc_lo[k] : w->mn_lo[k]));
    const __m128i hi = _mm_loadl_epi64((const __m128i *)w->hi[k]);
    const __m128i low4 = _mm_and_si128(upper ? _mm_srli_epi16(lo, 4) : lo, _mm_set1_epi8(15));
    const int shift = (kField == kScales ? 0 : 4) + 2 * upper;   // the two bits, moved to 4 and 5
    const __m128i high2 = _mm_and_si128(shift >= 4 ? _mm_srli_epi16(hi, shift - 4) : _mm_slli_epi16(hi, 4 - shift),
                                        _mm_set1_epi8(0x30));
    return _mm_or_si128(low4, high2);
}

// The minimums of sub-blocks 2p and 2p+1 as int16 pairs, one int32 lane per row (vpmaddwd).
inline __m256i q4k_min_pairs(const Q4Kx8Block *w, int p) {
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(q4k_bytes<kMins>(w, 2 * p), q4k_bytes<kMins>(w, 2 * p + 1)));
}
inline __m256i dpbusd(__m256i acc, __m256i u, int32_t q) { return _mm256_dpbusd_epi32(acc, u, _mm256_set1_epi32(q)); }

inline int32_t pair16(const int16_t *p) {
    int32_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

inline __m256 add_scaled(__m256 acc, __m256 dw, float da, __m256i isum) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(isum), acc);
}

struct Q4K : Avx512K {
    using Block = Q4Kx8Block;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act,
                                      int64_t i) const {
        const __m256i low = _mm256_set1_epi8(0x0F);
        __m256i isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const int j = s / 2, high = s % 2;
            __m256i u[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i p = load32(w->qs + 256 * j + 32 * c);
                u[c] = _mm256_and_si256(high ? _mm256_srli_epi16(p, 4) : p, low);
            }
            const __m256i scale = _mm256_cvtepu8_epi32(q4k_bytes<kScales>(w, s));
            const int q0 = 16 * j + 8 * high;
            for (int t = 0; t < TT; t++) {
                const ActKBlock &a = act[i + t * nb];
                __m256i even = dpbusd(_mm256_setzero_si256(), u[0], quad(a, q0));
                __m256i odd = dpbusd(_mm256_setzero_si256(), u[1], quad(a, q0 + 1));
                for (int c = 2; c < 8; c += 2) {
                    even = dpbusd(even, u[c], quad(a, q0 + c));
                    odd = dpbusd(odd, u[c + 1], quad(a, q0 + c + 1));
                }
                isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(_mm256_add_epi32(even, odd), scale));
            }
        }
        __m256i mins[4];
        for (int p = 0; p < 4; p++) mins[p] = q4k_min_pairs(w, p);
        const __m256 dw = fp16x8(w->d), dmin = fp16x8(w->dmin);
        for (int t = 0; t < TT; t++) {
            const ActKBlock &a = act[i + t * nb];
            __m256i msum = _mm256_setzero_si256();
            for (int p = 0; p < 4; p++) msum = _mm256_dpwssd_epi32(msum, mins[p], _mm256_set1_epi32(pair16(a.bsum32 + 2 * p)));
            acc[t] = add_scaled(acc[t], dw, a.d, isum[t]);
            acc[t] = add_scaled(acc[t], dmin, -a.d, msum);
        }
    }
};

// Quad `quad` of chunk j's 6-bit weights (layout_qk.h), as gemm_qk_avx2.cpp.
inline __m256i six_bits(const Q6Kx8Block *w, int j, int quad) {
    const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    const __m256i l = load32(w->ql + 256 * j + 32 * (quad % 8));
    const __m256i lo = _mm256_and_si256(quad < 8 ? l : _mm256_srli_epi16(l, 4), low);
    const __m256i h = load32(w->qh + 128 * j + 32 * (quad % 4));
    __m256i hi;
    switch (quad / 4) {
        case 0: hi = _mm256_slli_epi16(h, 4); break;
        case 1: hi = _mm256_slli_epi16(h, 2); break;
        case 2: hi = h; break;
        default: hi = _mm256_srli_epi16(h, 2); break;
    }
    return _mm256_ternarylogic_epi32(lo, hi, top, 0xF8);   // lo | (hi & top)
}

// Q6_K: each sub-block's chain of four vpdpbusd starts at -32 bsum16_s, so it ends at
// sum (q - 32) q_a exactly; then times the row's scale.
struct Q6K : Avx512K {
    using Block = Q6Kx8Block;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act,
                                      int64_t i) const {
        __m256i isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = _mm256_setzero_si256();
        for (int s = 0; s < 16; s++) {
            const int j = s / 4, first = 4 * (s % 4);
            __m256i u[4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) u[q] = six_bits(w, j, first + q);
            const __m256i scale = _mm256_cvtepi8_epi32(load8(w->sc[s]));
            for (int t = 0; t < TT; t++) {
                const ActKBlock &a = act[i + t * nb];
                __m256i dot = dpbusd(_mm256_set1_epi32(-32 * a.bsum16[s]), u[0], quad(a, 4 * s));
                dot = dpbusd(dot, u[1], quad(a, 4 * s + 1));
                dot = dpbusd(dot, u[2], quad(a, 4 * s + 2));
                dot = dpbusd(dot, u[3], quad(a, 4 * s + 3));
                isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(dot, scale));
            }
        }
        const __m256 dw = fp16x8(w->d);
        for (int t = 0; t < TT; t++) acc[t] = add_scaled(acc[t], dw, act[i + t * nb].d, isum[t]);
    }
};

}  // namespace

KQuantKernels avx512_kquant_kernels() { return {tiles::run<Q4K>, tiles::run<Q6K>}; }

}  // namespace stackd

#pragma GCC pop_options
