// The three passes over a row of logits that sampling's log-probabilities make (sampling.cpp,
// logit_stats_of), per instruction set: the scalar reference in sampling.cpp, the AVX2 and
// AVX-512 ones in sampling_rows_x86.cpp (compiled for x86 only). Every path gives the same bits.
#pragma once

#include <cstdint>
#include <cstring>

namespace sampling_rows {

// e^x for x <= 0, without a call into libm: the loop over a row of logits vectorizes. x = n ln2
// + r with |r| <= ln2/2; e^r by its Taylor polynomial to degree 6 (relative error under 2e-7),
// 2^n put into the exponent bits. Below -87, e^x is under FLT_MIN: 0 is close enough.
// The SIMD paths do these very operations in this order (no fused multiply-add), so
// every path gives the same bits.
inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float round = 12582912.0f;                     // 1.5 * 2^23: adding it rounds to integer
    const float n = (x * 1.44269504088896341f + round) - round;
    const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;   // ln2, hi + lo
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t) n + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// A row's log-sum-exp adds e^(logit - max) in 16 float lanes (lane l takes the logits at
// i = l mod 16 of the whole 16-blocks, in order), then the rest and the lanes, in order, in
// double: the same sum on every path.
constexpr int32_t k_lanes = 16;

// The three passes over a row (maximum, the lanes' sums, the top n's candidates) per path.
// `above` is the first index from `from` on whose logit is not <= `floor` (n_vocab if none).
struct row_kernels {
    float (*max)(const float * logits, int32_t n_vocab);
    void (*lanes)(const float * logits, int32_t n_blocks, float max, float * lanes);
    int32_t (*above)(const float * logits, int32_t from, int32_t n_vocab, float floor);
};


float max_scalar(const float * logits, int32_t n_vocab);
void lanes_scalar(const float * logits, int32_t n_blocks, float max, float * lanes);
int32_t above_scalar(const float * logits, int32_t from, int32_t n_vocab, float floor);

// sampling_rows_x86.cpp (x86-64 builds only)
float max_avx512(const float * logits, int32_t n_vocab);
void lanes_avx512(const float * logits, int32_t n_blocks, float max, float * lanes);
int32_t above_avx512(const float * logits, int32_t from, int32_t n_vocab, float floor);
float max_avx2(const float * logits, int32_t n_vocab);
void lanes_avx2(const float * logits, int32_t n_blocks, float max, float * lanes);
int32_t above_avx2(const float * logits, int32_t from, int32_t n_vocab, float floor);

}  // namespace sampling_rows
