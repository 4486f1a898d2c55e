// GCC 12 flags its own _mm512 intrinsics as maybe-uninitialized; a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The AVX-512 bodies, Q4_1 and Q8_0, on the tile driver every path runs (tiles.h): VNNI's
// vpdpbusd does the u8 x s8 dot of four positions per row in one instruction, adding into an
// int32 lane per row; eight of them make a block's exact integer sum. Two row groups fill a
// 512-bit vector (16 rows); below 4 tokens, and for an odd last group, one group runs at 256
// bits (AVX512VL; kPairsFrom). Compiled for these instructions by the target pragma, chosen at
// run time (cpu_features.cpp). Float arithmetic as every other path (kernels.h).
#include <immintrin.h>

#include <vector>

#include "kernels.h"
#include "prefetch.h"  // before the target pragma: one baseline definition for every file

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "tiles.h"

namespace stackd {

namespace {

// NG row groups side by side (tiles.h): 8 NG rows, one int32 or float lane each.
template <int NG> struct Lanes;
template <> struct Lanes<1> { using I = __m256i; using F = __m256; };
template <> struct Lanes<2> { using I = __m512i; using F = __m512; };

// Two row groups a tile (a 512-bit tile) from kPairsFrom tokens, else one (256 bits). Below
// kPairsFrom tokens a step is bound by reading the weights, and a pair's two streams (its
// groups lie nb blocks apart) read DRAM slower than one group after another (bench/README.md,
// "Measurements behind design choices"); from kPairsFrom tokens the
// arithmetic dominates and pairs win. Tokens per tile: the eight weight vectors of a block are
// reused by each, and a token needs one accumulator, so eight tokens fit the 32 registers with
// the temporaries.
struct Avx512 {
    static constexpr int kTile = 8;
    static constexpr int64_t kPairsFrom = 4;
    template <int TT, int NG> using Acc = typename Lanes<NG>::F[TT];
};

// Two groups' 32 bytes side by side: 16 rows of four bytes.
inline __m512i pair256(const uint8_t *lo, const uint8_t *hi) {
    return _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

// Two groups' eight fp16 values as 16 floats.
inline __m512 pair_fp16(const uint16_t *lo, const uint16_t *hi) {
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)hi),
                                            _mm_loadu_si128((const __m128i *)lo)));
}

inline __m256i group256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
inline __m256 group_fp16(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

// v in every int32 lane.
template <class I>
inline I broadcast(int32_t v) {
    if constexpr (sizeof(I) == sizeof(__m512i)) return _mm512_set1_epi32(v);
    else return _mm256_set1_epi32(v);
}

// acc + u x (the activation quad q), four u8 x s8 products per int32 lane.
inline __m512i dpbusd(__m512i acc, __m512i u, int32_t q) { return _mm512_dpbusd_epi32(acc, u, broadcast<__m512i>(q)); }
inline __m256i dpbusd(__m256i acc, __m256i u, int32_t q) { return _mm256_dpbusd_epi32(acc, u, broadcast<__m256i>(q)); }
inline __m512i add32(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
inline __m256i add32(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }

// Each row's exact block sum: u[c] holds four weight bytes per row (unsigned), matched with
// activation bytes 4c .. 4c+3; `start` is the integer the sum starts from. Two chains of four
// vpdpbusd keep the adder busy; integer sums are exact in any order (kernels.h).
template <class I>
inline I block_dot(const I *u, const ActBlock &a, int32_t start = 0) {
    I even = dpbusd(broadcast<I>(start), u[0], quad(a, 0));
    I odd = dpbusd(broadcast<I>(0), u[1], quad(a, 1));
    for (int c = 2; c < 8; c += 2) {
        even = dpbusd(even, u[c], quad(a, c));
        odd = dpbusd(odd, u[c + 1], quad(a, c + 1));
    }
    return add32(even, odd);
}

// acc + (d_w d_a) isum, per row (kernels.h); acc + m_w s_a.
inline __m512 add_scaled(__m512 acc, __m512 dw, float da, __m512i isum) {
    return _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(isum), acc);
}
inline __m256 add_scaled(__m256 acc, __m256 dw, float da, __m256i isum) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(isum), acc);
}
inline __m512 add_min(__m512 acc, __m512 mw, float sa) { return _mm512_fmadd_ps(mw, _mm512_set1_ps(sa), acc); }
inline __m256 add_min(__m256 acc, __m256 mw, float sa) { return _mm256_fmadd_ps(mw, _mm256_set1_ps(sa), acc); }

// Row r's fifth bits of chunk c (bit c of byte 4r + i, layout.h) moved to bit 4 of the byte.
inline __m512i fifth_bits(__m512i qh, int c) {
    const __m512i bit = _mm512_and_si512(qh, _mm512_set1_epi8((char)(1 << c)));
    return c <= 4 ? _mm512_slli_epi16(bit, 4 - c) : _mm512_srli_epi16(bit, c - 4);
}
inline __m256i fifth_bits(__m256i qh, int c) {
    const __m256i bit = _mm256_and_si256(qh, _mm256_set1_epi8((char)(1 << c)));
    return c <= 4 ? _mm256_slli_epi16(bit, 4 - c) : _mm256_srli_epi16(bit, c - 4);
}
inline __m512i and8(__m512i a, __m512i b) { return _mm512_and_si512(a, b); }
inline __m256i and8(__m256i a, __m256i b) { return _mm256_and_si256(a, b); }
inline __m512i or8(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
inline __m256i or8(__m256i a, __m256i b) { return _mm256_or_si256(a, b); }
inline __m512i nibbles_high(__m512i p) { return _mm512_srli_epi16(p, 4); }
inline __m256i nibbles_high(__m256i p) { return _mm256_srli_epi16(p, 4); }
template <class I> inline I bytes(int8_t v) {
    if constexpr (sizeof(I) == sizeof(__m512i)) return _mm512_set1_epi8(v);
    else return _mm256_set1_epi8(v);
}

// A 32-weight block's unsigned values, unpacked once for every token of the tile: the nibbles
// (Q4_0, Q4_1, Q5_0, Q5_1; layout.h), with the fifth bits or-ed in for the Q5 types. u[c] holds
// four values per row for activation bytes 4c .. 4c+3; NG == 2 puts two groups side by side.
template <int NG, class Block, class I>
STACKD_BODY_INLINE void unpack(const Block *w, int64_t nb, I *u) {
    const I low = bytes<I>(0x0F);
#pragma GCC unroll 4  // kept in registers: a loop here went through the stack
    for (int j = 0; j < 4; j++) {
        I p;
        if constexpr (NG == 2) p = pair256(w[0].qs + 32 * j, w[nb].qs + 32 * j);
        else p = group256(w->qs + 32 * j);
        u[j] = and8(p, low);
        u[j + 4] = and8(nibbles_high(p), low);
    }
    if constexpr (std::is_same_v<Block, Q50x8Block> || std::is_same_v<Block, Q51x8Block>) {
        I qh;
        if constexpr (NG == 2) qh = pair256(w[0].qh, w[nb].qh);
        else qh = group256(w->qh);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) u[c] = or8(u[c], fifth_bits(qh, c));
    }
}

// Q4_1 and Q5_1: the nibbles of a block unpacked once into eight vectors (four positions per
// row each; Q5_1's fifth bits or-ed in), used by every token of the tile.
template <class BlockType>
struct Minimum : Avx512 {
    using Block = BlockType;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act,
                                      int64_t i) const {
        using I = typename Lanes<NG>::I;
        I u[8];
        typename Lanes<NG>::F dw, mw;
        unpack<NG>(w, nb, u);
        if constexpr (NG == 2) {
            dw = pair_fp16(w[0].d, w[nb].d);
            mw = pair_fp16(w[0].m, w[nb].m);
        } else {
            dw = group_fp16(w->d);
            mw = group_fp16(w->m);
        }
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[i + t * nb];
            acc[t] = add_min(add_scaled(acc[t], dw, a.d, block_dot(u, a)), mw, a.s);
        }
    }
};

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

// Q8_0: the weights are stored as q + 128 (layout.h), the unsigned operand of vpdpbusd, and
// each block's integer sum starts at -128 times the sum of the block's 32 activation bytes
// (corr, one per token-block of the call, indexed as act), so it ends exactly at
// sum(q_w * q_a).
struct Q8_0 : Avx512 {
    using Block = Q8x8Block;
    const int32_t *corr;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act,
                                      int64_t i) const {
        using I = typename Lanes<NG>::I;
        I u[8];
        typename Lanes<NG>::F dw;
        if constexpr (NG == 2) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) u[c] = pair256(w[0].qs + 32 * c, w[nb].qs + 32 * c);
            dw = pair_fp16(w[0].d, w[nb].d);
        } else {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) u[c] = group256(w->qs + 32 * c);
            dw = group_fp16(w->d);
        }
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[i + t * nb];
            acc[t] = add_scaled(acc[t], dw, a.d, block_dot(u, a, corr[i + t * nb]));
        }
    }
};

// The kernel of a body that reads the corrections (Q8_0, Q4_0, Q5_0): each thread derives
// those of every token-block it reads (one vpdpbusd per block, against 16 rows x 8 for each
// block of the weights it multiplies).
template <class Body>
void gemm_corrected(const typename Body::Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                    const ActBlock *act, int64_t n_tokens, const GemmOut &out) {
    thread_local std::vector<int32_t> corr;
    if (corr.size() < (size_t)(n_tokens * nb)) corr.resize(n_tokens * nb);
    correct(act, n_tokens * nb, corr.data());
    tiles::gemm(Body{{}, corr.data()}, w, nb, rows, g_begin, g_end, act, n_tokens, out);
}

// Q4_0 and Q5_0: Q4_1's nibbles (Q5_0's fifth bits or-ed in), no minimum; each block's integer
// starts at -8 or -16 x the activation sum: the Q8_0 correction (-128 x the sum) shifted right
// by 4 or 3, exactly.
template <class BlockType>
struct Offset : Avx512 {
    using Block = BlockType;
    static constexpr bool kFifth = std::is_same_v<Block, Q50x8Block>;
    static constexpr int kShift = kFifth ? 3 : 4;
    const int32_t *corr;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act,
                                      int64_t i) const {
        using I = typename Lanes<NG>::I;
        I u[8];
        typename Lanes<NG>::F dw;
        unpack<NG>(w, nb, u);
        if constexpr (NG == 2) dw = pair_fp16(w[0].d, w[nb].d);
        else dw = group_fp16(w->d);
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[i + t * nb];
            acc[t] = add_scaled(acc[t], dw, a.d, block_dot(u, a, corr[i + t * nb] >> kShift));
        }
    }
};

}  // namespace

Kernels avx512_kernels() {
    return {tiles::run<Minimum<Q4x8Block>>, gemm_corrected<Q8_0>, gemm_corrected<Offset<Q40x8Block>>,
            gemm_corrected<Offset<Q50x8Block>>, tiles::run<Minimum<Q51x8Block>>};
}

}  // namespace stackd

#pragma GCC pop_options
