// GCC 12 flags its own _mm512 intrinsics as maybe-uninitialized; a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The K-quant AVX-512 VNNI bodies, Q4_K and Q6_K, on the tile driver every path runs
// (tiles.h): vpdpbusd adds a sub-block's u8 x s8 products into one int32 lane per row, a
// vpmulld by the row's sub-block scale makes sc_s * dot_s, and vpdpwssd adds Q4_K's
// minimum terms. Two row groups a tile (16 rows, 512 bits) from 4 tokens, else one (256 bits
// with AVX512VL); eight tokens a tile.
// Chosen at run time (cpu_features.cpp). Integer and float arithmetic as kernels_qk.h.
#include <immintrin.h>

#include <cstddef>

#include "kernels.h"
#include "kernels_qk.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "tiles.h"

namespace stackd {

namespace {

// NG row groups side by side (tiles.h): 8 NG rows, one int32 or float lane each.
template <int NG> struct Lanes;
template <> struct Lanes<1> { using I = __m256i; using F = __m256; };
template <> struct Lanes<2> { using I = __m512i; using F = __m512; };

// Two row groups a tile (16 rows in a 512-bit vector) from kPairsFrom tokens, else one, as the
// Q4_1 body (gemm_avx512.cpp: below 4 tokens a step streams weights, and one group after
// another streams faster); eight tokens a tile.
struct Avx512K {
    using Act = ActKBlock;
    static constexpr int kTile = 8;
    static constexpr int64_t kPairsFrom = 4;
    template <int TT, int NG> using Acc = typename Lanes<NG>::F[TT];
};

inline __m128i load8(const void *p) { return _mm_loadl_epi64((const __m128i *)p); }

inline int32_t pair16(const int16_t *p) {
    int32_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

// Overloads by lane width: broadcast, u8 x s8 and s16 x s16 dot products, integer and float ops.
template <class I> inline I broadcast(int32_t v) {
    if constexpr (sizeof(I) == sizeof(__m512i)) return _mm512_set1_epi32(v);
    else return _mm256_set1_epi32(v);
}
inline __m512i dpbusd(__m512i acc, __m512i u, int32_t q) { return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(q)); }
inline __m256i dpbusd(__m256i acc, __m256i u, int32_t q) { return _mm256_dpbusd_epi32(acc, u, _mm256_set1_epi32(q)); }
inline __m512i dpwssd(__m512i acc, __m512i a, int32_t b) { return _mm512_dpwssd_epi32(acc, a, _mm512_set1_epi32(b)); }
inline __m256i dpwssd(__m256i acc, __m256i a, int32_t b) { return _mm256_dpwssd_epi32(acc, a, _mm256_set1_epi32(b)); }
inline __m512i add32(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
inline __m256i add32(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
inline __m512i mul32(__m512i a, __m512i b) { return _mm512_mullo_epi32(a, b); }
inline __m256i mul32(__m256i a, __m256i b) { return _mm256_mullo_epi32(a, b); }
inline __m512 add_scaled(__m512 acc, __m512 dw, float da, __m512i isum) {
    return _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(isum), acc);
}
inline __m256 add_scaled(__m256 acc, __m256 dw, float da, __m256i isum) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(isum), acc);
}

// The NG groups' 32 weight bytes at `offset` of their blocks (group j's block at w + j*nb).
template <int NG, class Block>
inline typename Lanes<NG>::I bytes32(const Block *w, int64_t nb, size_t offset) {
    const auto *lo = reinterpret_cast<const uint8_t *>(w) + offset;
    if constexpr (NG == 2) {
        const auto *hi = reinterpret_cast<const uint8_t *>(w + nb) + offset;
        return _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                                  _mm256_loadu_si256((const __m256i *)hi), 1);
    } else {
        return _mm256_loadu_si256((const __m256i *)lo);
    }
}

// The NG groups' eight fp16 row scales as floats.
template <int NG, class Block>
inline typename Lanes<NG>::F scales_fp16(const Block *w, int64_t nb, size_t offset) {
    const auto *lo = reinterpret_cast<const uint8_t *>(w) + offset;
    if constexpr (NG == 2) {
        const auto *hi = reinterpret_cast<const uint8_t *>(w + nb) + offset;
        return _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)hi), _mm_loadu_si128((const __m128i *)lo)));
    } else {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)lo));
    }
}

// Per-row bytes (8 a group, from get(block)) widened to int32 lanes: unsigned or signed.
template <int NG, bool kSigned, class Block, class Get>
inline typename Lanes<NG>::I widen32(const Block *w, int64_t nb, Get get) {
    if constexpr (NG == 2) {
        const __m128i b = _mm_unpacklo_epi64(get(w[0]), get(w[nb]));
        return kSigned ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
    } else {
        return kSigned ? _mm256_cvtepi8_epi32(get(w[0])) : _mm256_cvtepu8_epi32(get(w[0]));
    }
}

// Sub-block s's eight 6-bit scales (minimums: kMins) as bytes, one per row (layout_qk.h).
enum Q4KField { kScales, kMins };
template <Q4KField kField, class Block>
inline __m128i q4k_bytes(const Block &w, int s) {
    const int k = s % 4, upper = s / 4;
    const __m128i lo = load8(kField == kScales ? w.sc_lo[k] : w.mn_lo[k]);
    const __m128i hi = load8(w.hi[k]);
    const __m128i low4 = _mm_and_si128(upper ? _mm_srli_epi16(lo, 4) : lo, _mm_set1_epi8(15));
    const int shift = (kField == kScales ? 0 : 4) + 2 * upper;   // the two bits, moved to 4 and 5
    const __m128i high2 = _mm_and_si128(shift >= 4 ? _mm_srli_epi16(hi, shift - 4) : _mm_slli_epi16(hi, 4 - shift),
                                        _mm_set1_epi8(0x30));
    return _mm_or_si128(low4, high2);
}

// The minimums of sub-blocks 2p and 2p+1 as int16 pairs, one int32 lane per row (vpdpwssd).
template <int NG, class Block>
inline typename Lanes<NG>::I q4k_min_pairs(const Block *w, int64_t nb, int p) {
    auto pairs = [p](const Block &b) {
        return _mm_unpacklo_epi8(q4k_bytes<kMins>(b, 2 * p), q4k_bytes<kMins>(b, 2 * p + 1));
    };
    if constexpr (NG == 2) {
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi16(pairs(w[0]))),
                                  _mm256_cvtepu8_epi16(pairs(w[nb])), 1);
    } else {
        return _mm256_cvtepu8_epi16(pairs(w[0]));
    }
}

// Q4_K and Q5_K (whose fifth bits, bit s of the plane's vector c, are or-ed in at bit 4).
template <class BlockType>
struct Q4K : Avx512K {
    using Block = BlockType;
    static constexpr bool kFifth = std::is_same_v<Block, Q5Kx8Block>;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act,
                                      int64_t i) const {
        using I = typename Lanes<NG>::I;
        const I low = broadcast<I>(0x0F0F0F0F);
        I isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = broadcast<I>(0);
        for (int s = 0; s < 8; s++) {
            const int j = s / 2, high = s % 2;
            I u[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const I p = bytes32<NG>(w, nb, offsetof(Block, qs) + 256 * j + 32 * c);
                if constexpr (NG == 2) u[c] = _mm512_and_si512(high ? _mm512_srli_epi16(p, 4) : p, low);
                else u[c] = _mm256_and_si256(high ? _mm256_srli_epi16(p, 4) : p, low);
                if constexpr (kFifth) {
                    const I bit = bytes32<NG>(w, nb, offsetof(Block, qh) + 32 * c);
                    const I mask = broadcast<I>((int32_t)(0x01010101u << s));
                    if constexpr (NG == 2) {
                        const __m512i b = _mm512_and_si512(bit, mask);
                        u[c] = _mm512_or_si512(u[c], s <= 4 ? _mm512_slli_epi16(b, 4 - s) : _mm512_srli_epi16(b, s - 4));
                    } else {
                        const __m256i b = _mm256_and_si256(bit, mask);
                        u[c] = _mm256_or_si256(u[c], s <= 4 ? _mm256_slli_epi16(b, 4 - s) : _mm256_srli_epi16(b, s - 4));
                    }
                }
            }
            const I scale = widen32<NG, false>(w, nb, [s](const Block &b) { return q4k_bytes<kScales>(b, s); });
            const int q0 = 16 * j + 8 * high;
            for (int t = 0; t < TT; t++) {
                const ActKBlock &a = act[i + t * nb];
                I even = dpbusd(broadcast<I>(0), u[0], quad(a, q0));
                I odd = dpbusd(broadcast<I>(0), u[1], quad(a, q0 + 1));
                for (int c = 2; c < 8; c += 2) {
                    even = dpbusd(even, u[c], quad(a, q0 + c));
                    odd = dpbusd(odd, u[c + 1], quad(a, q0 + c + 1));
                }
                isum[t] = add32(isum[t], mul32(add32(even, odd), scale));
            }
        }
        I mins[4];
        for (int p = 0; p < 4; p++) mins[p] = q4k_min_pairs<NG>(w, nb, p);
        const auto dw = scales_fp16<NG>(w, nb, offsetof(Block, d));
        const auto dmin = scales_fp16<NG>(w, nb, offsetof(Block, dmin));
        for (int t = 0; t < TT; t++) {
            const ActKBlock &a = act[i + t * nb];
            I msum = broadcast<I>(0);
            for (int p = 0; p < 4; p++) msum = dpwssd(msum, mins[p], pair16(a.bsum32 + 2 * p));
            acc[t] = add_scaled(acc[t], dw, a.d, isum[t]);
            acc[t] = add_scaled(acc[t], dmin, -a.d, msum);
        }
    }
};

// Quad `quad` of chunk j's 6-bit weights (layout_qk.h), as gemm_qk_avx2.cpp, for NG groups.
template <int NG>
inline typename Lanes<NG>::I six_bits(const Q6Kx8Block *w, int64_t nb, int j, int quad) {
    using I = typename Lanes<NG>::I;
    const I l = bytes32<NG>(w, nb, offsetof(Q6Kx8Block, ql) + 256 * j + 32 * (quad % 8));
    const I h = bytes32<NG>(w, nb, offsetof(Q6Kx8Block, qh) + 128 * j + 32 * (quad % 4));
    const I low = broadcast<I>(0x0F0F0F0F), top = broadcast<I>(0x30303030);
    if constexpr (NG == 2) {
        const __m512i lo = _mm512_and_si512(quad < 8 ? l : _mm512_srli_epi16(l, 4), low);
        __m512i hi;
        switch (quad / 4) {   // bits 2s, 2s+1 of each byte to bits 4, 5
            case 0: hi = _mm512_slli_epi16(h, 4); break;
            case 1: hi = _mm512_slli_epi16(h, 2); break;
            case 2: hi = h; break;
            default: hi = _mm512_srli_epi16(h, 2); break;
        }
        return _mm512_ternarylogic_epi32(lo, hi, top, 0xF8);   // lo | (hi & top)
    } else {
        const __m256i lo = _mm256_and_si256(quad < 8 ? l : _mm256_srli_epi16(l, 4), low);
        __m256i hi;
        switch (quad / 4) {
            case 0: hi = _mm256_slli_epi16(h, 4); break;
            case 1: hi = _mm256_slli_epi16(h, 2); break;
            case 2: hi = h; break;
            default: hi = _mm256_srli_epi16(h, 2); break;
        }
        return _mm256_ternarylogic_epi32(lo, hi, top, 0xF8);
    }
}

// Q6_K: each sub-block's chain of four vpdpbusd starts at -32 bsum16_s, so it ends at
// sum (q - 32) q_a exactly; then times the row's scale.
struct Q6K : Avx512K {
    using Block = Q6Kx8Block;
    // Pairs at every batch: rebuilding the 6-bit weights (two loads, a shift and a ternary
    // logic op a quad) outweighs the weight stream even at one token, so 16 rows a vector win
    // there too (bench/README.md, "K-quants").
    static constexpr int64_t kPairsFrom = 1;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act,
                                      int64_t i) const {
        using I = typename Lanes<NG>::I;
        I isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = broadcast<I>(0);
        for (int s = 0; s < 16; s++) {
            const int j = s / 4, first = 4 * (s % 4);
            I u[4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) u[q] = six_bits<NG>(w, nb, j, first + q);
            const I scale = widen32<NG, true>(w, nb, [s](const Block &b) { return load8(b.sc[s]); });
            for (int t = 0; t < TT; t++) {
                const ActKBlock &a = act[i + t * nb];
                I dot = dpbusd(broadcast<I>(-32 * a.bsum16[s]), u[0], quad(a, 4 * s));
                dot = dpbusd(dot, u[1], quad(a, 4 * s + 1));
                dot = dpbusd(dot, u[2], quad(a, 4 * s + 2));
                dot = dpbusd(dot, u[3], quad(a, 4 * s + 3));
                isum[t] = add32(isum[t], mul32(dot, scale));
            }
        }
        const auto dw = scales_fp16<NG>(w, nb, offsetof(Block, d));
        for (int t = 0; t < TT; t++) acc[t] = add_scaled(acc[t], dw, act[i + t * nb].d, isum[t]);
    }
};

}  // namespace

KQuantKernels avx512_kquant_kernels() {
    return {tiles::run<Q4K<Q4Kx8Block>>, tiles::run<Q6K>, tiles::run<Q4K<Q5Kx8Block>>};
}

}  // namespace stackd

#pragma GCC pop_options
