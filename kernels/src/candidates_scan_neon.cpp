// The candidates scan's NEON body (candidates_scan.h): 16 logits a try, as four compares whose
// lanes are narrowed to one 64-bit word (a nibble a lane) to find the first above the floor.
// Plain ARMv8.0 Advanced SIMD: no target needed. fcmgt is false for NaN, as x > floor is.
#include <arm_neon.h>

#include "candidates_scan.h"

namespace stackd {

int64_t above_neon(const float *x, int64_t from, int64_t n, float floor) {
    const float32x4_t f = vdupq_n_f32(floor);
    int64_t i = from;
    for (; i + 16 <= n; i += 16) {
        const uint16x8_t lo = vcombine_u16(vmovn_u32(vcgtq_f32(vld1q_f32(x + i), f)),
                                           vmovn_u32(vcgtq_f32(vld1q_f32(x + i + 4), f)));
        const uint16x8_t hi = vcombine_u16(vmovn_u32(vcgtq_f32(vld1q_f32(x + i + 8), f)),
                                           vmovn_u32(vcgtq_f32(vld1q_f32(x + i + 12), f)));
        const uint8x16_t bytes = vcombine_u8(vmovn_u16(lo), vmovn_u16(hi));   // 0xFF where above
        const uint64_t nibbles = vget_lane_u64(vreinterpret_u64_u8(vshrn_n_u16(vreinterpretq_u16_u8(bytes), 4)), 0);
        if (nibbles != 0) return i + __builtin_ctzll(nibbles) / 4;
    }
    return above_scalar(x, i, n, floor);
}

}  // namespace stackd
