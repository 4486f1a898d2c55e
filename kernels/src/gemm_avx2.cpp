// The AVX2 bodies (with FMA and F16C), Q4_1 and Q8_0, on the tile driver every path runs
// (tiles.h). Compiled for those instructions by the target pragma below, not by a build flag,
// so the library still loads on any x86-64; cpu_features.cpp decides at run time whether this
// code may run. Without VNNI the u8 x s8 product is vpmaddubsw (pairs into int16 lanes), then
// vpmaddwd turns the lanes into each row's int32 sum; float arithmetic as kernels.h.
#include <immintrin.h>

#include <vector>

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

// Row r's fifth bits of chunk c (bit c of byte 4r + i, layout.h) moved to bit 4 of the byte.
inline __m256i fifth_bits(__m256i qh, int c) {
    const __m256i bit = _mm256_and_si256(qh, _mm256_set1_epi8((char)(1 << c)));
    return c <= 4 ? _mm256_slli_epi16(bit, 4 - c) : _mm256_srli_epi16(bit, c - 4);
}

// Q4_1 and Q5_1: each 32-byte step of the block's weights is unpacked once (Q5_1's fifth bits
// or-ed in) and used by every token. vpmaddubsw: u8 x s8 pairs into int16 lanes; Q4_1's are at
// most |2 x 15 x 127| = 3810, so eight of them (all four steps) stay within 30480 and one
// vpmaddwd per token and block turns the lanes into each row's int32 sum; Q5_1's reach 7874,
// so its lanes are widened every two steps (31496), as Q5_0's.
template <class BlockType>
struct Minimum : Avx2 {
    using Block = BlockType;
    static constexpr bool kFifth = std::is_same_v<Block, Q51x8Block>;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act,
                                      int64_t i) const {
        const __m256i low = _mm256_set1_epi8(0x0F);
        const __m256i ones = _mm256_set1_epi16(1);
        __m256i pairs[TT], isum[TT];
        for (int t = 0; t < TT; t++) pairs[t] = isum[t] = _mm256_setzero_si256();
        __m256i qh = _mm256_setzero_si256();
        if constexpr (kFifth) qh = _mm256_loadu_si256((const __m256i *)w->qh);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * j));
            __m256i lo = _mm256_and_si256(p, low), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
            if constexpr (kFifth) {
                lo = _mm256_or_si256(lo, fifth_bits(qh, j));
                hi = _mm256_or_si256(hi, fifth_bits(qh, j + 4));
            }
            for (int t = 0; t < TT; t++) {
                const ActBlock &a = act[i + t * nb];
                pairs[t] = _mm256_add_epi16(pairs[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(quad(a, j))));
                STACKD_KEEP_CHAIN(pairs[t]);
                pairs[t] = _mm256_add_epi16(pairs[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(quad(a, j + 4))));
                STACKD_KEEP_CHAIN(pairs[t]);
            }
            if (!kFifth ? j == 3 : j % 2 == 1) {
                for (int t = 0; t < TT; t++) {
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(pairs[t], ones));
                    pairs[t] = _mm256_setzero_si256();
                }
            }
        }
        const __m256 dw = fp16x8(w->d), mw = fp16x8(w->m);
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[i + t * nb];
            acc[t] = add_scaled(acc[t], dw, a.d, isum[t]);
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
                STACKD_KEEP_CHAIN(isum[t]);
            }
        }
        const __m256 dw = fp16x8(w->d);
        for (int t = 0; t < TT; t++) acc[t] = add_scaled(acc[t], dw, act[i + t * nb].d, isum[t]);
    }
};

// -offset x (the sum of each token-block's 32 activation bytes), for Q4_0 (offset 8) and Q5_0
// (16): vpmaddubsw of ones against the bytes, vpmaddwd into int32, then the eight lanes added.
void offset_sums(const ActBlock *act, int64_t count, int32_t offset, int32_t *out) {
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < count; i++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)act[i].q);
        const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
        const __m128i half = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
        const __m128i quarter = _mm_add_epi32(half, _mm_unpackhi_epi64(half, half));
        out[i] = -offset * (_mm_cvtsi128_si32(quarter) + _mm_extract_epi32(quarter, 1));
    }
}

// Q4_0 and Q5_0: Q4_1's unpacking (with Q5_0's fifth bits or-ed in), the integer starting at
// start[i] = -8 or -16 x the activation sum. Q5_0's values reach 31: a vpmaddubsw pair is at
// most 2 x 31 x 127 = 7874, so the int16 lanes take two steps' pairs (31496) before vpmaddwd
// moves them into int32; Q4_0's take all four (30480), as Q4_1's.
template <class BlockType>
struct Offset : Avx2 {
    using Block = BlockType;
    static constexpr bool kFifth = std::is_same_v<Block, Q50x8Block>;
    const int32_t *start;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act,
                                      int64_t i) const {
        const __m256i low = _mm256_set1_epi8(0x0F);
        const __m256i ones = _mm256_set1_epi16(1);
        __m256i pairs[TT], isum[TT];
        for (int t = 0; t < TT; t++) {
            pairs[t] = _mm256_setzero_si256();
            isum[t] = _mm256_set1_epi32(start[i + t * nb]);
        }
        __m256i qh = _mm256_setzero_si256();
        if constexpr (kFifth) qh = _mm256_loadu_si256((const __m256i *)w->qh);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * j));
            __m256i lo = _mm256_and_si256(p, low), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
            if constexpr (kFifth) {
                lo = _mm256_or_si256(lo, fifth_bits(qh, j));
                hi = _mm256_or_si256(hi, fifth_bits(qh, j + 4));
            }
            for (int t = 0; t < TT; t++) {
                const ActBlock &a = act[i + t * nb];
                pairs[t] = _mm256_add_epi16(pairs[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(quad(a, j))));
                STACKD_KEEP_CHAIN(pairs[t]);
                pairs[t] = _mm256_add_epi16(pairs[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(quad(a, j + 4))));
                STACKD_KEEP_CHAIN(pairs[t]);
            }
            if (!kFifth ? j == 3 : j % 2 == 1) {
                for (int t = 0; t < TT; t++) {
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(pairs[t], ones));
                    pairs[t] = _mm256_setzero_si256();
                }
            }
        }
        const __m256 dw = fp16x8(w->d);
        for (int t = 0; t < TT; t++) acc[t] = add_scaled(acc[t], dw, act[i + t * nb].d, isum[t]);
    }
};

// A Q4_0 / Q5_0 kernel: each thread derives the starts of every token-block it reads.
template <class Block, int32_t kOffset>
void gemm_offset(const Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end, const ActBlock *act,
                 int64_t n_tokens, const GemmOut &out) {
    thread_local std::vector<int32_t> start;
    if (start.size() < (size_t)(n_tokens * nb)) start.resize(n_tokens * nb);
    offset_sums(act, n_tokens * nb, kOffset, start.data());
    tiles::gemm(Offset<Block>{{}, start.data()}, w, nb, rows, g_begin, g_end, act, n_tokens, out);
}

}  // namespace

Kernels avx2_kernels() {
    return {tiles::run<Minimum<Q4x8Block>>, tiles::run<Q8_0>, gemm_offset<Q40x8Block, 8>, gemm_offset<Q50x8Block, 16>,
            tiles::run<Minimum<Q51x8Block>>};
}

}  // namespace stackd

#pragma GCC pop_options
