// The NEON bodies of the 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on the tile driver
// every path runs (tiles.h), written once for both aarch64 paths: gemm_neon.cpp instantiates
// them for the dot products (kMmla false), gemm_neon_i8mm.cpp for the int8 matrix multiplies
// (kMmla true), each under its own target pragma (as tiles.h says of the x86 files); the
// second defines STACKD_NEON_I8MM first (GCC 12's pragma does not set __ARM_FEATURE_MATMUL_INT8).
//
// The weights are x86's layout as they are (layout.h): a row group's 32-byte step of one
// 4-position chunk holds rows 0-3 in its first 16 bytes and rows 4-7 in its second, four bytes
// a row, which is exactly one `sdot` operand: `vdotq_laneq_s32(isum, w, a, j)` adds, for each
// of four rows, the four products with the activation bytes of lane j (kernels/README.md, "The
// ARM paths"). So a served buffer's bytes, a repacked file's, are the same on every CPU.
//
// The integers (kernels.h): every value is made signed before its dot product (Q4_0's q - 8,
// Q5_0's q - 16, Q8_0's stored q + 128 back to q; Q4_1's 0..15 and Q5_1's 0..31 are signed
// already), so each block's int32 is exactly sum(q_w * q_a), whatever order the instructions
// add it in; the float operations are kernels.h's, one vfmaq_f32 each, in order.
#pragma once

#include <arm_neon.h>

#include <type_traits>
#include <utility>

#include "kernels.h"
#include "tiles.h"

namespace stackd {
namespace {   // each including file's own copies, for its own target (tiles.h)
namespace neon {

// f(std::integral_constant<int, j>) for j = 0 .. N-1: lanes and shifts must be constants.
template <class F, int... J>
STACKD_BODY_INLINE void unroll_seq(F &&f, std::integer_sequence<int, J...>) {
    (f(std::integral_constant<int, J>{}), ...);
}
template <int N, class F>
STACKD_BODY_INLINE void unroll(F &&f) {
    unroll_seq(f, std::make_integer_sequence<int, N>{});
}

inline float32x4_t fp16x4(const uint16_t *h) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))); }

// acc + (d_w d_a) isum, per row (kernels.h): the product rounded, then one fused multiply-add.
inline float32x4_t add_scaled(float32x4_t acc, float32x4_t dw, float da, int32x4_t isum) {
    return vfmaq_f32(acc, vmulq_n_f32(dw, da), vcvtq_f32_s32(isum));
}

// Bit C of each byte moved to bit 4 (a Q5 plane's fifth bits of chunk C, layout.h).
template <int C>
inline uint8x16_t fifth_bits(uint8x16_t qh) {
    const uint8x16_t bit = vandq_u8(qh, vdupq_n_u8((uint8_t)(1u << C)));
    if constexpr (C < 4) return vshlq_n_u8(bit, 4 - C);
    else if constexpr (C == 4) return bit;
    else return vshrq_n_u8(bit, C - 4);
}

// Which 32-weight format a body reads: its signed offset, fifth bits and minimum.
template <class Block> struct Format;
template <> struct Format<Q4x8Block>  { static constexpr int kOffset = 0,  kFifth = 0, kMin = 1; };
template <> struct Format<Q51x8Block> { static constexpr int kOffset = 0,  kFifth = 1, kMin = 1; };
template <> struct Format<Q40x8Block> { static constexpr int kOffset = 8,  kFifth = 0, kMin = 0; };
template <> struct Format<Q50x8Block> { static constexpr int kOffset = 16, kFifth = 1, kMin = 0; };
template <> struct Format<Q8x8Block>  { static constexpr int kOffset = 0,  kFifth = 0, kMin = 0; };

// A block's eight chunks of signed weights, w[c][h]: chunk c (positions 4c .. 4c+3), rows
// 4h .. 4h+3, four bytes a row. Unpacked once per block, for every token of the tile.
template <class Block>
STACKD_BODY_INLINE void signed_weights(const Block *w, int8x16_t (&out)[8][2]) {
    using F = Format<Block>;
    if constexpr (std::is_same_v<Block, Q8x8Block>) {
        const uint8x16_t flip = vdupq_n_u8(0x80);
        for (int c = 0; c < 8; c++)
            for (int h = 0; h < 2; h++) out[c][h] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w->qs + 32 * c + 16 * h), flip));
    } else {
        const uint8x16_t low = vdupq_n_u8(0x0F);
        const int8x16_t offset = vdupq_n_s8((int8_t)F::kOffset);
        uint8x16_t qh[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if constexpr (F::kFifth) qh[0] = vld1q_u8(w->qh), qh[1] = vld1q_u8(w->qh + 16);
        unroll<4>([&](auto J) {
            constexpr int j = decltype(J)::value;
            for (int h = 0; h < 2; h++) {
                const uint8x16_t p = vld1q_u8(w->qs + 32 * j + 16 * h);
                uint8x16_t lo = vandq_u8(p, low), hi = vshrq_n_u8(p, 4);
                if constexpr (F::kFifth) {
                    lo = vorrq_u8(lo, fifth_bits<j>(qh[h]));
                    hi = vorrq_u8(hi, fifth_bits<j + 4>(qh[h]));
                }
                out[j][h] = vsubq_s8(vreinterpretq_s8_u8(lo), offset);
                out[j + 4][h] = vsubq_s8(vreinterpretq_s8_u8(hi), offset);
            }
        });
    }
}

// The dot products: isum[t][h] += the four rows' products with token t's chunk c, one sdot a
// chunk, the chunk's four activation bytes taken as a lane of the token's loaded 16.
template <int TT>
STACKD_BODY_INLINE void dots_sdot(const int8x16_t (&w)[8][2], const ActBlock *act, int64_t nb, int64_t i,
                                  int32x4_t (&isum)[TT][2]) {
    for (int t = 0; t < TT; t++) {
        const int8x16_t a_lo = vld1q_s8(act[i + t * nb].q), a_hi = vld1q_s8(act[i + t * nb].q + 16);
        int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
        unroll<4>([&](auto J) {
            constexpr int j = decltype(J)::value;
            s0 = vdotq_laneq_s32(s0, w[j][0], a_lo, j);
            s1 = vdotq_laneq_s32(s1, w[j][1], a_lo, j);
            s0 = vdotq_laneq_s32(s0, w[j + 4][0], a_hi, j);
            s1 = vdotq_laneq_s32(s1, w[j + 4][1], a_hi, j);
        });
        isum[t][0] = s0;
        isum[t][1] = s1;
    }
}

#if defined(STACKD_NEON_I8MM)
// The same integers by smmla, two tokens at a time: vmmlaq_s32(c, a, b) adds the 2x2 products
// of a's two 8-byte rows with b's. a: two weight rows at chunks j and j + 4 (a 32-bit zip of
// the two chunks' registers: rows 4h, 4h+1, or 4h+2, 4h+3); b: the two tokens' bytes at the
// same chunks. Lanes come out [r t0, r t1, r' t0, r' t1]; one unzip gives each token's four rows.
// Per 8 rows and 2 tokens: 16 smmla where sdot takes 32.
template <int TT>
STACKD_BODY_INLINE void dots_smmla(const int8x16_t (&w)[8][2], const ActBlock *act, int64_t nb, int64_t i,
                                   int32x4_t (&isum)[TT][2]) {
    static_assert(TT % 2 == 0, "smmla takes tokens in pairs");
    int8x16_t pairs[4][4];   // pairs[j][q]: rows (2q, 2q+1) of the group at chunks j, j + 4
    for (int j = 0; j < 4; j++)
        for (int h = 0; h < 2; h++) {
            const int32x4_t lo = vreinterpretq_s32_s8(w[j][h]), hi = vreinterpretq_s32_s8(w[j + 4][h]);
            pairs[j][2 * h] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));
            pairs[j][2 * h + 1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));
        }
    for (int t = 0; t < TT; t += 2) {
        int32x4_t z1[2], z2[2];   // token u's chunks (0, 4, 1, 5) and (2, 6, 3, 7)
        for (int u = 0; u < 2; u++) {
            const int32x4_t a_lo = vreinterpretq_s32_s8(vld1q_s8(act[i + (t + u) * nb].q));
            const int32x4_t a_hi = vreinterpretq_s32_s8(vld1q_s8(act[i + (t + u) * nb].q + 16));
            z1[u] = vzip1q_s32(a_lo, a_hi);
            z2[u] = vzip2q_s32(a_lo, a_hi);
        }
        int8x16_t b[4];   // b[j]: token t's chunks j, j + 4, then token t + 1's
        b[0] = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s32(z1[0]), vreinterpretq_s64_s32(z1[1])));
        b[1] = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s32(z1[0]), vreinterpretq_s64_s32(z1[1])));
        b[2] = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s32(z2[0]), vreinterpretq_s64_s32(z2[1])));
        b[3] = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s32(z2[0]), vreinterpretq_s64_s32(z2[1])));
        int32x4_t m[4];
        for (int q = 0; q < 4; q++) {
            m[q] = vmmlaq_s32(vdupq_n_s32(0), pairs[0][q], b[0]);
            for (int j = 1; j < 4; j++) m[q] = vmmlaq_s32(m[q], pairs[j][q], b[j]);
        }
        for (int h = 0; h < 2; h++) {
            isum[t][h] = vuzp1q_s32(m[2 * h], m[2 * h + 1]);
            isum[t + 1][h] = vuzp2q_s32(m[2 * h], m[2 * h + 1]);
        }
    }
}
#endif

// One group (8 rows, two registers) a tile, four tokens: 8 float and 8 integer accumulators,
// the block's 16 weight registers, within the 32.
template <class BlockType, bool kMmla>
struct Body {
    using Block = BlockType;
    static constexpr int kTile = 4;
    static constexpr int64_t kPairsFrom = 0;
    template <int TT, int NG> using Acc = float32x4_t[TT][2];

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act,
                                      int64_t i) const {
        int8x16_t weights[8][2];
        signed_weights(w, weights);
        int32x4_t isum[TT][2];
#if defined(STACKD_NEON_I8MM)
        if constexpr (kMmla && TT % 2 == 0) dots_smmla<TT>(weights, act, nb, i, isum);
        else dots_sdot<TT>(weights, act, nb, i, isum);   // a lone token: half of smmla's work is waste
#else
        static_assert(!kMmla, "the i8mm body needs the target's i8mm");
        dots_sdot<TT>(weights, act, nb, i, isum);
#endif
        for (int h = 0; h < 2; h++) {
            const float32x4_t dw = fp16x4(w->d + 4 * h);
            float32x4_t mw = vdupq_n_f32(0.0f);
            if constexpr (Format<Block>::kMin) mw = fp16x4(w->m + 4 * h);
            for (int t = 0; t < TT; t++) {
                const ActBlock &a = act[i + t * nb];
                acc[t][h] = add_scaled(acc[t][h], dw, a.d, isum[t][h]);
                if constexpr (Format<Block>::kMin) acc[t][h] = vfmaq_f32(acc[t][h], mw, vdupq_n_f32(a.s));
            }
        }
    }
};

template <bool kMmla>
Kernels kernels() {
    return {tiles::run<Body<Q4x8Block, kMmla>>, tiles::run<Body<Q8x8Block, kMmla>>,
            tiles::run<Body<Q40x8Block, kMmla>>, tiles::run<Body<Q50x8Block, kMmla>>,
            tiles::run<Body<Q51x8Block, kMmla>>};
}

}  // namespace neon
}  // namespace
}  // namespace stackd
