// The AVX2 bodies (with FMA and F16C), Q4_1 and Q8_0, on the tile driver every path runs
// (tiles.h). Compiled for those instructions by the target pragma below, not by a build flag,
// so the library still loads on any x86-64; cpu_features.cpp decides at run time whether this
// code may run. Without VNNI the u8 x s8 product is vpmaddubsw (pairs into int16 lanes), then
// vpmaddwd turns the lanes into each row's int32 sum; float arithmetic as kernels.h.
#include <immintrin.h>

#include "kernels.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "tiles.h"

namespace stackd {

namespace {

// One group (8 rows) a tile. Tokens per tile: a token needs an integer and a float accumulator;
// with the two weight vectors of one step and the constants, four tokens fit the 16 registers.
struct Avx2 {
    static constexpr int kTile = 4;
    static constexpr int64_t kPairsFrom = 0;
    template <int TT, int NG> using Acc = __m256[TT];
};

// acc + (d_w d_a) isum, per row (kernels.h).
inline __m256 add_scaled(__m256 acc, __m256 dw, float da, __m256i isum) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(isum), acc);
}

inline __m256 fp16x8(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

// Q4_1: each 32-byte step of the block's weights is unpacked once and used by every token.
struct Q4_1 : Avx2 {
    using Block = Q4x8Block;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act,
                                      int64_t i) const {
        const __m256i low = _mm256_set1_epi8(0x0F);
        const __m256i ones = _mm256_set1_epi16(1);
        // vpmaddubsw: u8 x s8 pairs into int16 lanes (|2 x 15 x 127| = 3810). Eight of those
        // added per lane stay within 30480, exact in int16, so one vpmaddwd per token and
        // block turns the lanes into each row's int32 sum.
        __m256i pairs[TT];
        for (int t = 0; t < TT; t++) pairs[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * j));
            const __m256i lo = _mm256_and_si256(p, low), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
            for (int t = 0; t < TT; t++) {
                const ActBlock &a = act[i + t * nb];
                const __m256i sum = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(quad(a, j))),
                                                     _mm256_maddubs_epi16(hi, _mm256_set1_epi32(quad(a, j + 4))));
                pairs[t] = _mm256_add_epi16(pairs[t], sum);
            }
        }
        const __m256 dw = fp16x8(w->d), mw = fp16x8(w->m);
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[i + t * nb];
            acc[t] = add_scaled(acc[t], dw, a.d, _mm256_madd_epi16(pairs[t], ones));
            acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s), acc[t]);
        }
    }
};

// Q8_0: vpmaddubsw's int16 pair sums would overflow on the stored q + 128 (2 x 255 x 127), so
// the weights go back to signed bytes and ggml's own sign trick applies: |q_w| times q_a
// carrying q_w's sign (pairs stay within 2 x 128 x 127). Each of the block's eight 32-byte
// steps is loaded and made signed once for every token.
struct Q8_0 : Avx2 {
    using Block = Q8x8Block;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act,
                                      int64_t i) const {
        const __m256i offset = _mm256_set1_epi8((char)0x80);
        const __m256i ones = _mm256_set1_epi16(1);
        __m256i isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w->qs + 32 * c)), offset);
            const __m256i magnitude = _mm256_sign_epi8(q, q);
            for (int t = 0; t < TT; t++) {
                const __m256i signed_a = _mm256_sign_epi8(_mm256_set1_epi32(quad(act[i + t * nb], c)), q);
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_a), ones));
            }
        }
        const __m256 dw = fp16x8(w->d);
        for (int t = 0; t < TT; t++) acc[t] = add_scaled(acc[t], dw, act[i + t * nb].d, isum[t]);
    }
};

}  // namespace

Kernels avx2_kernels() { return {tiles::run<Q4_1>, tiles::run<Q8_0>}; }

}  // namespace stackd

#pragma GCC pop_options
