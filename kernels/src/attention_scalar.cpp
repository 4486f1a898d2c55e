// The reference body of decode attention: attention.h's arithmetic, one operation at a time.
// The SIMD bodies compute the same bits (tests/kernels/test_attention.py).
#include <cmath>
#include <cstring>
#include <limits>

#include "attention.h"
#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"  // block_q8_0

namespace stackd {

namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

float sum16(const float *x) {
    float r8[8], r4[4], r2[2];
    for (int l = 0; l < 8; l++) r8[l] = x[l] + x[l + 8];
    for (int l = 0; l < 4; l++) r4[l] = r8[l] + r8[l + 4];
    for (int l = 0; l < 2; l++) r2[l] = r4[l] + r4[l + 2];
    return r2[0] + r2[1];
}

float exp16_lane(float x) {
    if (!(x >= kExpFloor)) return 0.0f;
    const float n = std::nearbyint(x * kLog2e);
    float r = std::fma(n, -kLn2Hi, x);
    r = std::fma(n, -kLn2Lo, r);
    float p = kExpPoly[0];
    for (int i = 1; i < 6; i++) p = std::fma(p, r, kExpPoly[i]);
    const float y = std::fma(p, r * r, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float pow2n;
    std::memcpy(&pow2n, &bits, sizeof pow2n);
    return y * pow2n;
}

// Value i of a cache row: f16 converted, or q8_0's int8 times its block's f16 scale.
float value(const AttentionTask &t, const char *row, int64_t i) {
    if (t.kv_type == GGML_TYPE_F16) return ggml_fp16_to_fp32(((const uint16_t *)row)[i]);
    const auto &block = ((const block_q8_0 *)row)[i / QK8_0];
    return ggml_fp16_to_fp32(block.d) * (float)block.qs[i % QK8_0];
}

float dot(const AttentionTask &t, const char *k, const float *q) {
    float a[16] = {};
    for (int64_t j = 0; j < t.dk; j += 16)
        for (int l = 0; l < 16; l++) a[l] = std::fma(value(t, k, j + l), q[j + l], a[l]);
    return sum16(a);
}

bool live(const AttentionTask &t, int r, int64_t c) {
    return c < t.n_kv && (t.mask[r] == nullptr || t.mask[r][c] != kMaskedBits);
}

}  // namespace

void attend_scalar(const AttentionTask &t) {
    float M[kMaxTaskRows], S[kMaxTaskRows];
    static thread_local float q[kMaxTaskRows][kMaxHeadSize];
    for (int r = 0; r < t.n_rows; r++)
        for (int64_t d = 0; d < t.dk; d++) q[r][d] = ggml_fp16_to_fp32(ggml_fp32_to_fp16(t.q[r][d]));
    for (int r = 0; r < t.n_rows; r++) {
        M[r] = kMinusInf;
        S[r] = 0.0f;
        for (int64_t e = 0; e < t.dv; e++) t.acc[r * t.dv + e] = 0.0f;
    }
    for (int64_t c0 = 0; c0 < t.n_kv; c0 += kCellBlock) {
        for (int r = 0; r < t.n_rows; r++) {
            float s[kCellBlock], p[kCellBlock];
            float m = kMinusInf;
            for (int c = 0; c < kCellBlock; c++) {
                s[c] = kMinusInf;
                if (!live(t, r, c0 + c)) continue;
                const float mv = t.mask[r] ? ggml_fp16_to_fp32(t.mask[r][c0 + c]) : 0.0f;
                s[c] = dot(t, t.k + (c0 + c) * t.k_stride, q[r]) * t.scale + mv;
                m = std::fmax(m, s[c]);
            }
            if (m == kMinusInf) continue;
            const float next = std::fmax(M[r], m);
            const float ms = M[r] == kMinusInf ? 0.0f : exp16_lane(M[r] - next);
            for (int c = 0; c < kCellBlock; c++) p[c] = s[c] == kMinusInf ? 0.0f : exp16_lane(s[c] - next);
            S[r] = S[r] * ms + sum16(p);
            float *acc = t.acc + r * t.dv;
            for (int64_t e = 0; e < t.dv; e++) acc[e] = acc[e] * ms;
            for (int c = 0; c < kCellBlock; c++) {
                if (s[c] == kMinusInf) continue;
                const char *v = t.v + (c0 + c) * t.v_stride;
                for (int64_t e = 0; e < t.dv; e++) acc[e] = std::fma(p[c], value(t, v, e), acc[e]);
            }
            M[r] = next;
        }
    }
    for (int r = 0; r < t.n_rows; r++) {
        const float inv = S[r] == 0.0f ? 0.0f : 1.0f / S[r];
        for (int64_t e = 0; e < t.dv; e++) t.out[r][e] = t.acc[r * t.dv + e] * inv;
    }
}

}  // namespace stackd
