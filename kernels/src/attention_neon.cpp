// Decode attention's NEON body: attention_body.h on four 4-float registers, lanes 0-3, 4-7,
// 8-11 and 12-15 of attention.h's sixteen. Plain ARMv8.0 Advanced SIMD (fp16 conversions, fused
// multiply-adds and round-to-nearest are all baseline), so no target pragma; it serves both
// aarch64 paths, chosen at run time with the matmuls. The same bits as the scalar body:
// sum16's tree is spelled lane for lane (l + 8, then + 4, + 2, + 1), exp16 is attention.h's
// operations one vector instruction each, f16 rounding is FCVTN's (to nearest, ties to even,
// as ggml_fp32_to_fp16).
#include <arm_neon.h>

#include "attention_body.h"

namespace stackd {

namespace {

struct NeonPack {
    struct F {
        float32x4_t v[4];
    };
    static constexpr int kValueChunks = 2;  // 2 rows x 2 chunks x 4, and 8 for V: 24 of the 32 registers

    template <class Op>
    static F map(Op op, F a) {
        return {{op(a.v[0]), op(a.v[1]), op(a.v[2]), op(a.v[3])}};
    }
    template <class Op>
    static F map(Op op, F a, F b) {
        return {{op(a.v[0], b.v[0]), op(a.v[1], b.v[1]), op(a.v[2], b.v[2]), op(a.v[3], b.v[3])}};
    }

    static F zero() { return set1(0.0f); }
    static F set1(float x) {
        const float32x4_t v = vdupq_n_f32(x);
        return {{v, v, v, v}};
    }
    static F load(const float *x) { return {{vld1q_f32(x), vld1q_f32(x + 4), vld1q_f32(x + 8), vld1q_f32(x + 12)}}; }
    static float32x4_t f16x4(const uint16_t *h) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))); }
    static F load_f16(const uint16_t *h) { return {{f16x4(h), f16x4(h + 4), f16x4(h + 8), f16x4(h + 12)}}; }
    // int8 x the f16 scale as a float: exact (8 bits times 11), as the scalar body's product
    static F load_q8(const int8_t *q, uint16_t d) {
        const float scale = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(d))), 0);
        const int8x16_t bytes = vld1q_s8(q);
        const int16x8_t lo = vmovl_s8(vget_low_s8(bytes)), hi = vmovl_high_s8(bytes);
        const int32x4_t w[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_high_s16(lo), vmovl_s16(vget_low_s16(hi)),
                                vmovl_high_s16(hi)};
        F out;
        for (int k = 0; k < 4; k++) out.v[k] = vmulq_n_f32(vcvtq_f32_s32(w[k]), scale);
        return out;
    }
    static void store(float *x, F a) {
        for (int k = 0; k < 4; k++) vst1q_f32(x + 4 * k, a.v[k]);
    }
    static F round_f16(F x) {
        return map([](float32x4_t v) { return vcvt_f32_f16(vcvt_f16_f32(v)); }, x);
    }
    static F add(F a, F b) { return map([](float32x4_t x, float32x4_t y) { return vaddq_f32(x, y); }, a, b); }
    static F mul(F a, F b) { return map([](float32x4_t x, float32x4_t y) { return vmulq_f32(x, y); }, a, b); }
    // a * b + c, fused (vfmaq_f32(c, a, b) is c + a * b rounded once)
    static F fma(F a, F b, F c) {
        F out;
        for (int k = 0; k < 4; k++) out.v[k] = vfmaq_f32(c.v[k], a.v[k], b.v[k]);
        return out;
    }

    // Lane l of the result is a's where bit l is set, b's otherwise.
    static F select(uint32_t bits, F a, F b) {
        const uint32x4_t bit = {1, 2, 4, 8};
        F out;
        for (int k = 0; k < 4; k++) {
            const uint32x4_t lanes = vtstq_u32(vdupq_n_u32(bits >> (4 * k)), bit);
            out.v[k] = vbslq_f32(lanes, a.v[k], b.v[k]);
        }
        return out;
    }

    // attention.h's tree: lane l + lane l+8 (registers 0+2, 1+3), then + 4 on (the two sums'
    // registers), + 2 on (a register's halves), + 1 on.
    template <class Combine4, class Combine2>
    static float fold16(F a, Combine4 c4, Combine2 c2) {
        const float32x4_t r4 = c4(c4(a.v[0], a.v[2]), c4(a.v[1], a.v[3]));
        const float32x2_t r2 = c2(vget_low_f32(r4), vget_high_f32(r4));
        return vget_lane_f32(c2(r2, vdup_lane_f32(r2, 1)), 0);
    }
    static float sum16(F a) {
        return fold16(a, [](float32x4_t x, float32x4_t y) { return vaddq_f32(x, y); },
                      [](float32x2_t x, float32x2_t y) { return vadd_f32(x, y); });
    }
    static float max16(F a) {
        return fold16(a, [](float32x4_t x, float32x4_t y) { return vmaxq_f32(x, y); },
                      [](float32x2_t x, float32x2_t y) { return vmax_f32(x, y); });
    }

    static float32x4_t exp4(float32x4_t x) {
        const uint32x4_t keep = vcgeq_f32(x, vdupq_n_f32(kExpFloor));   // false for NaN, as !(x >= floor)
        const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, kLog2e));      // to nearest, ties to even
        float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-kLn2Hi));
        r = vfmaq_f32(r, n, vdupq_n_f32(-kLn2Lo));
        float32x4_t p = vdupq_n_f32(kExpPoly[0]);
        for (int i = 1; i < 6; i++) p = vfmaq_f32(vdupq_n_f32(kExpPoly[i]), p, r);
        const float32x4_t y = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
        const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
        const float32x4_t scaled = vmulq_f32(y, vreinterpretq_f32_s32(e));
        return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(scaled), keep));
    }
    static F exp16(F x) { return map(exp4, x); }

    // The bits of the sixteen mask values that are not -inf: each 8-lane compare weighted by its
    // lane's bit and added across.
    static uint32_t unmasked(const uint16_t *mask) {
        const uint16x8_t weights = {1, 2, 4, 8, 16, 32, 64, 128};
        const uint16x8_t inf = vdupq_n_u16(kMaskedBits);
        const uint32_t lo = vaddvq_u16(vandq_u16(vceqq_u16(vld1q_u16(mask), inf), weights));
        const uint32_t hi = vaddvq_u16(vandq_u16(vceqq_u16(vld1q_u16(mask + 8), inf), weights));
        return ~(lo | hi << 8) & 0xFFFFu;
    }
};

}  // namespace

void attend_neon(const AttentionTask &task) { attention_body::attend<NeonPack>(task); }

}  // namespace stackd
