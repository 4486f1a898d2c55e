// The K-quant NEON bodies (Q4_K, Q5_K, Q6_K) on the tile driver every path runs (tiles.h), for
// both aarch64 paths (the sub-block scales multiply each row's dot product on its own: an
// sdot's int32 lane per row is the shape, smmla's 2x2 products would need unzipping before
// every scale). Compiled for ARMv8.2-A with the dot products by the target pragma, chosen at
// run time (cpu_features.cpp). The weights are x86's layout (layout_qk.h): each 32-byte step of
// a chunk is rows 0-3 then rows 4-7, four bytes a row, one sdot operand each; every value is
// signed before its dot product (Q6_K's q - 32), so the integers are kernels_qk.h's exactly,
// and the float operations are its sequence, one vfmaq_f32 each.
#include <arm_neon.h>

#include "kernels.h"
#include "kernels_qk.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#include "gemm_neon_body.h"   // unroll, fp16x4, add_scaled, fifth_bits
#include "tiles.h"

namespace stackd {

namespace {

using neon::add_scaled;
using neon::fp16x4;
using neon::unroll;

// One group (8 rows, two registers) a tile, four tokens, as the 32-weight bodies.
struct NeonK {
    using Act = ActKBlock;
    static constexpr int kTile = 4;
    static constexpr int64_t kPairsFrom = 0;
    template <int TT, int NG> using Acc = float32x4_t[TT][2];
};

// An 8-byte vector's values, widened to int32: rows 0-3 and 4-7.
inline void widen(uint8x8_t v, int32x4_t (&out)[2]) {
    const uint16x8_t wide = vmovl_u8(v);
    out[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(wide)));
    out[1] = vreinterpretq_s32_u32(vmovl_high_u16(wide));
}
inline void widen(int8x8_t v, int32x4_t (&out)[2]) {
    const int16x8_t wide = vmovl_s8(v);
    out[0] = vmovl_s16(vget_low_s16(wide));
    out[1] = vmovl_high_s16(wide);
}

// Sub-block S's eight 6-bit scales (or minimums), one byte a row (layout_qk.h's packing).
enum Q4KField { kScales, kMins };
template <Q4KField kField, int S, class Block>
inline uint8x8_t q4k_bytes(const Block *w) {
    constexpr int k = S % 4, upper = S / 4;
    const uint8x8_t lo = vld1_u8(kField == kScales ? w->sc_lo[k] : w->mn_lo[k]);
    const uint8x8_t hi = vld1_u8(w->hi[k]);
    const uint8x8_t low4 = vand_u8(upper ? vshr_n_u8(lo, 4) : lo, vdup_n_u8(15));
    constexpr int shift = (kField == kScales ? 0 : 4) + 2 * upper;   // the two bits, moved to 4 and 5
    uint8x8_t moved;
    if constexpr (shift > 4) moved = vshr_n_u8(hi, shift - 4);
    else if constexpr (shift == 4) moved = hi;
    else moved = vshl_n_u8(hi, 4 - shift);
    return vorr_u8(low4, vand_u8(moved, vdup_n_u8(0x30)));
}

// Q4_K and Q5_K: per sub-block, each row's dot product of 32 weights by eight sdots, then times
// the row's scale into isum; the minimums' sum from the activations' 32-sums.
template <class BlockType>
struct Q4K : NeonK {
    using Block = BlockType;
    static constexpr bool kFifth = std::is_same_v<Block, Q5Kx8Block>;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act,
                                      int64_t i) const {
        const uint8x16_t low = vdupq_n_u8(0x0F);
        int32x4_t isum[TT][2], msum[TT][2];
        for (int t = 0; t < TT; t++)
            for (int h = 0; h < 2; h++) isum[t][h] = msum[t][h] = vdupq_n_s32(0);
        unroll<8>([&](auto S) {
            constexpr int s = decltype(S)::value, j = s / 2, high = s % 2;
            int32x4_t scale[2], mins[2];
            widen(q4k_bytes<kScales, s>(w), scale);
            widen(q4k_bytes<kMins, s>(w), mins);
            int8x16_t a[TT][2];   // token t's 32 bytes of the sub-block: chunks 0-3, 4-7
            int32x4_t dot[TT][2];
            for (int t = 0; t < TT; t++) {
                a[t][0] = vld1q_s8(act[i + t * nb].q + 32 * s);
                a[t][1] = vld1q_s8(act[i + t * nb].q + 32 * s + 16);
                dot[t][0] = dot[t][1] = vdupq_n_s32(0);
            }
            unroll<8>([&](auto C) {
                constexpr int c = decltype(C)::value;
                for (int h = 0; h < 2; h++) {
                    const uint8x16_t p = vld1q_u8(w->qs + 256 * j + 32 * c + 16 * h);
                    uint8x16_t u = high ? vshrq_n_u8(p, 4) : vandq_u8(p, low);
                    if constexpr (kFifth) u = vorrq_u8(u, neon::fifth_bits<s>(vld1q_u8(w->qh + 32 * c + 16 * h)));
                    for (int t = 0; t < TT; t++)
                        dot[t][h] = vdotq_laneq_s32(dot[t][h], vreinterpretq_s8_u8(u), a[t][c / 4], c % 4);
                }
            });
            for (int t = 0; t < TT; t++) {
                const int32_t bsum = act[i + t * nb].bsum32[s];
                for (int h = 0; h < 2; h++) {
                    isum[t][h] = vmlaq_s32(isum[t][h], dot[t][h], scale[h]);
                    msum[t][h] = vmlaq_n_s32(msum[t][h], mins[h], bsum);
                }
            }
        });
        for (int h = 0; h < 2; h++) {
            const float32x4_t dw = fp16x4(w->d + 4 * h), dmin = fp16x4(w->dmin + 4 * h);
            for (int t = 0; t < TT; t++) {
                const float da = act[i + t * nb].d;
                acc[t][h] = add_scaled(acc[t][h], dw, da, isum[t][h]);
                acc[t][h] = add_scaled(acc[t][h], dmin, -da, msum[t][h]);
            }
        }
    }
};

// Q6_K: per 16-value sub-block s (chunk s / 4, quarter u = s % 4), quad q of it is the low
// nibbles' vector (4u + q) % 8 of the chunk (high nibbles from u = 2 on) and bits 2u of the
// top bits' vector q (layout_qk.h); the values less 32, four sdots a row, times the row's scale.
struct Q6K : NeonK {
    using Block = Q6Kx8Block;

    template <int TT, int NG>
    STACKD_BODY_INLINE void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act,
                                      int64_t i) const {
        const uint8x16_t low = vdupq_n_u8(0x0F), two = vdupq_n_u8(0x30);
        const int8x16_t bias = vdupq_n_s8(32);
        int32x4_t isum[TT][2];
        for (int t = 0; t < TT; t++) isum[t][0] = isum[t][1] = vdupq_n_s32(0);
        unroll<16>([&](auto S) {
            constexpr int s = decltype(S)::value, jj = s / 4, u = s % 4;
            int32x4_t scale[2];
            widen(vld1_s8(w->sc[s]), scale);
            int8x16_t a[TT];
            int32x4_t dot[TT][2];
            for (int t = 0; t < TT; t++) {
                a[t] = vld1q_s8(act[i + t * nb].q + 16 * s);
                dot[t][0] = dot[t][1] = vdupq_n_s32(0);
            }
            unroll<4>([&](auto Q) {
                constexpr int q = decltype(Q)::value;
                for (int h = 0; h < 2; h++) {
                    const uint8x16_t l = vld1q_u8(w->ql + 256 * jj + 32 * ((4 * u + q) % 8) + 16 * h);
                    const uint8x16_t hb = vld1q_u8(w->qh + 128 * jj + 32 * q + 16 * h);
                    const uint8x16_t nib = u >= 2 ? vshrq_n_u8(l, 4) : vandq_u8(l, low);
                    uint8x16_t top;   // bits 2u, 2u + 1 moved to 4, 5
                    if constexpr (2 * u < 4) top = vshlq_n_u8(hb, 4 - 2 * u);
                    else if constexpr (2 * u == 4) top = hb;
                    else top = vshrq_n_u8(hb, 2 * u - 4);
                    const int8x16_t v = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib, vandq_u8(top, two))), bias);
                    for (int t = 0; t < TT; t++) dot[t][h] = vdotq_laneq_s32(dot[t][h], v, a[t], q);
                }
            });
            for (int t = 0; t < TT; t++)
                for (int h = 0; h < 2; h++) isum[t][h] = vmlaq_s32(isum[t][h], dot[t][h], scale[h]);
        });
        for (int h = 0; h < 2; h++) {
            const float32x4_t dw = fp16x4(w->d + 4 * h);
            for (int t = 0; t < TT; t++) acc[t][h] = add_scaled(acc[t][h], dw, act[i + t * nb].d, isum[t][h]);
        }
    }
};

}  // namespace

KQuantKernels neon_kquant_kernels() {
    return {tiles::run<Q4K<Q4Kx8Block>>, tiles::run<Q6K>, tiles::run<Q4K<Q5Kx8Block>>};
}

}  // namespace stackd

#pragma GCC pop_options
