// The K-quant AVX2 bodies (with FMA and F16C), Q4_K and Q6_K, on the tile driver every path
// runs (tiles.h), compiled for those instructions by the target pragma and chosen at run time
// (cpu_features.cpp). The u8 x s8 products are vpmaddubsw pairs in int16 lanes; each
// sub-block's vpmaddwd against its per-row scale (both int16 halves of a row's lane) makes
// sc_s * dot_s in the row's int32 lane. Integer and float arithmetic as kernels_qk.h.
#include <immintrin.h>

#include "kernels.h"
#include "kernels_qk.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "tiles.h"

namespace stackd {

namespace {

// One group (8 rows) a tile; four tokens, as the Q4_1 body (16 registers).
struct Avx2K {
    using Act = ActKBlock;
    static constexpr int kTile = 4;
    static constexpr int64_t kPairsFrom = 0;
    template <int TT, int NG> using Acc = __m256[TT];
};

inline __m256 fp16x8(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }
inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
inline __m128i load8(const void *p) { return _mm_loadl_epi64((const __m128i *)p); }

// Sub-block s's eight 6-bit scales (minimums: kMins) as bytes, one per row (layout_qk.h).
enum Q4KField { kScales, kMins };
template <Q4KField kField, class Block>
inline __m128i q4k_bytes(const Block *w, int s) {
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
template <class Block>
inline __m256i q4k_min_pairs(const Block *w, int p) {
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(q4k_bytes<kMins>(w, 2 * p), q4k_bytes<kMins>(w, 2 * p + 1)));
}

// A row's int32 scale in both of its lane's int16 halves (|scale| < 2^15), for vpmaddwd.
inline __m256i both_halves(__m256i scale32) {
    return _mm256_or_si256(_mm256_and_si256(scale32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(scale32, 16));
}

// Two consecutive int16 activation sums as one int32, to broadcast.
inline int32_t pair16(const int16_t *p) {
    int32_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

// acc + (d_w d_a) isum and acc + (dmin_w (-d_a)) msum, per row (kernels_qk.h).
inline __m256 add_scaled(__m256 acc, __m256 dw, float da, __m256i isum) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(isum), acc);
}

// Sub-block s's fifth bits of chunk c (bit s of each byte of the plane's vector c) at bit 4.
inline __m256i fifth_bits(const Q5Kx8Block *w, int s, int c) {
    const __m256i bit = _mm256_and_si256(load32(w->qh + 32 * c), _mm256_set1_epi8((char)(1 << s)));
    return s <= 4 ? _mm256_slli_epi16(bit, 4 - s) : _mm256_srli_epi16(bit, s - 4);
}

// Q4_K and Q5_K: vpmaddubsw pairs of a 32-weight Q4_K sub-block stay within 8 x 2 x 15 x 127 =
// 30480 in int16; Q5_K's values reach 31, so its pairs go through vpmaddwd every four chunks
// (4 x 2 x 31 x 127 = 31496).
template <class BlockType>
struct Q4K : Avx2K {
    using Block = BlockType;
    static constexpr bool kFifth = std::is_same_v<Block, Q5Kx8Block>;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act,
                                      int64_t i) const {
        const __m256i low = _mm256_set1_epi8(0x0F);
        __m256i isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const int j = s / 2, high = s % 2;
            const __m256i scale = both_halves(_mm256_cvtepu8_epi32(q4k_bytes<kScales>(w, s)));
            __m256i pairs[TT];
            for (int t = 0; t < TT; t++) pairs[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i p = load32(w->qs + 256 * j + 32 * c);
                __m256i u = _mm256_and_si256(high ? _mm256_srli_epi16(p, 4) : p, low);
                if constexpr (kFifth) u = _mm256_or_si256(u, fifth_bits(w, s, c));
                for (int t = 0; t < TT; t++) {
                    pairs[t] = _mm256_add_epi16(
                        pairs[t], _mm256_maddubs_epi16(u, _mm256_set1_epi32(quad(act[i + t * nb], 16 * j + 8 * high + c))));
                    STACKD_KEEP_CHAIN(pairs[t]);
                }
                if (c == 7 || (kFifth && c == 3)) {
                    for (int t = 0; t < TT; t++) {
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(pairs[t], scale));
                        pairs[t] = _mm256_setzero_si256();
                    }
                }
            }
        }
        __m256i mins[4];
        for (int p = 0; p < 4; p++) mins[p] = q4k_min_pairs(w, p);
        const __m256 dw = fp16x8(w->d), dmin = fp16x8(w->dmin);
        for (int t = 0; t < TT; t++) {
            const ActKBlock &a = act[i + t * nb];
            __m256i msum = _mm256_setzero_si256();
            for (int p = 0; p < 4; p++)
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins[p], _mm256_set1_epi32(pair16(a.bsum32 + 2 * p))));
            acc[t] = add_scaled(acc[t], dw, a.d, isum[t]);
            acc[t] = add_scaled(acc[t], dmin, -a.d, msum);
        }
    }
};

// Quad `quad` (four positions per row) of chunk j's 6-bit weights (layout_qk.h).
inline __m256i six_bits(const Q6Kx8Block *w, int j, int quad) {
    const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    const __m256i l = load32(w->ql + 256 * j + 32 * (quad % 8));
    const __m256i lo = _mm256_and_si256(quad < 8 ? l : _mm256_srli_epi16(l, 4), low);
    const __m256i h = load32(w->qh + 128 * j + 32 * (quad % 4));
    __m256i hi;
    switch (quad / 4) {   // bits 2s, 2s+1 of each byte to bits 4, 5
        case 0: hi = _mm256_slli_epi16(h, 4); break;
        case 1: hi = _mm256_slli_epi16(h, 2); break;
        case 2: hi = h; break;
        default: hi = _mm256_srli_epi16(h, 2); break;
    }
    return _mm256_or_si256(lo, _mm256_and_si256(hi, top));
}

// Q6_K: vpmaddubsw pairs of two quads stay within 2 x 2 x 63 x 127 = 32004 in int16, so a
// 16-weight sub-block is two vpmaddwd against its scale. The -32 of every weight comes last,
// as -32 sum_s sc_s bsum16_s (vpmaddwd of the scales, two sub-blocks a lane, and the sums).
struct Q6K : Avx2K {
    using Block = Q6Kx8Block;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act,
                                      int64_t i) const {
        __m256i isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = _mm256_setzero_si256();
        for (int s = 0; s < 16; s++) {
            const int j = s / 4, first = 4 * (s % 4);
            const __m256i scale = both_halves(_mm256_cvtepi8_epi32(load8(w->sc[s])));
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                const __m256i u0 = six_bits(w, j, first + 2 * half), u1 = six_bits(w, j, first + 2 * half + 1);
                for (int t = 0; t < TT; t++) {
                    const ActKBlock &a = act[i + t * nb];
                    const int k = 4 * s + 2 * half;   // the activation quad of u0
                    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(u0, _mm256_set1_epi32(quad(a, k))),
                                                           _mm256_maddubs_epi16(u1, _mm256_set1_epi32(quad(a, k + 1))));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(pairs, scale));
                    STACKD_KEEP_CHAIN(isum[t]);
                }
            }
        }
        __m256i scale_pairs[8];
        for (int p = 0; p < 8; p++)
            scale_pairs[p] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(load8(w->sc[2 * p]), load8(w->sc[2 * p + 1])));
        const __m256 dw = fp16x8(w->d);
        for (int t = 0; t < TT; t++) {
            const ActKBlock &a = act[i + t * nb];
            __m256i corr = _mm256_setzero_si256();
            for (int p = 0; p < 8; p++)
                corr = _mm256_add_epi32(corr, _mm256_madd_epi16(scale_pairs[p], _mm256_set1_epi32(pair16(a.bsum16 + 2 * p))));
            acc[t] = add_scaled(acc[t], dw, a.d, _mm256_sub_epi32(isum[t], _mm256_slli_epi32(corr, 5)));
        }
    }
};

}  // namespace

KQuantKernels avx2_kquant_kernels() {
    return {tiles::run<Q4K<Q4Kx8Block>>, tiles::run<Q6K>, tiles::run<Q4K<Q5Kx8Block>>};
}

}  // namespace stackd

#pragma GCC pop_options
