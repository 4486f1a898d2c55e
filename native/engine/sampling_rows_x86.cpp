// Sampling's row passes with AVX2 and AVX-512 (sampling_rows.h), each function compiled for its
// target by attribute and chosen by __builtin_cpu_supports (sampling.cpp): the library runs on
// any x86-64.
#include <immintrin.h>

#include <cmath>

#include "sampling_rows.h"

namespace sampling_rows {

// No contraction into fused multiply-adds: each operation rounds as the scalar one does.
#define STACKD_ROW_AVX512 __attribute__((target("avx512f"), optimize("fp-contract=off")))
#define STACKD_ROW_AVX2 __attribute__((target("avx2"), optimize("fp-contract=off")))

STACKD_ROW_AVX512 float max_avx512(const float * logits, int32_t n_vocab) {
    __m512 acc = _mm512_set1_ps(logits[0]);
    int32_t i = 0;
    for (; i + 16 <= n_vocab; i += 16) {
        acc = _mm512_max_ps(_mm512_loadu_ps(logits + i), acc);
    }
    float max = _mm512_reduce_max_ps(acc);   // NaN only from token 0: then every lane holds it
    if (std::isnan(logits[0])) {
        return logits[0];
    }
    for (; i < n_vocab; ++i) {
        max = logits[i] > max ? logits[i] : max;
    }
    return max;
}

STACKD_ROW_AVX512 void lanes_avx512(const float * logits, int32_t n_blocks, float max, float * lanes) {
    const __m512 vmax = _mm512_set1_ps(max);
    const __m512 lowest = _mm512_set1_ps(-87.0f), round = _mm512_set1_ps(12582912.0f);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693145751953125f), ln2_lo = _mm512_set1_ps(1.428606765330187e-06f);
    const __m512 c720 = _mm512_set1_ps(1.0f / 720.0f), c120 = _mm512_set1_ps(1.0f / 120.0f);
    const __m512 c24 = _mm512_set1_ps(1.0f / 24.0f), c6 = _mm512_set1_ps(1.0f / 6.0f);
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512i bias = _mm512_set1_epi32(127);
    __m512 acc = _mm512_loadu_ps(lanes);
    for (int32_t b = 0; b < n_blocks; ++b) {
        __m512 x = _mm512_sub_ps(_mm512_loadu_ps(logits + b * k_lanes), vmax);
        x = _mm512_max_ps(lowest, x);                    // x < -87 ? -87 : x (a NaN stays)
        const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, log2e), round), round);
        const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, ln2_hi)), _mm512_mul_ps(n, ln2_lo));
        __m512 p = c720;
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c120);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c24);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c6);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), half);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), one);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), one);
        const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), bias), 23);
        acc = _mm512_add_ps(acc, _mm512_mul_ps(p, _mm512_castsi512_ps(bits)));
    }
    _mm512_storeu_ps(lanes, acc);
}

STACKD_ROW_AVX512 int32_t above_avx512(const float * logits, int32_t from, int32_t n_vocab, float floor) {
    const __m512 vfloor = _mm512_set1_ps(floor);
    int32_t t = from;
    for (; t + 16 <= n_vocab; t += 16) {
        const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(logits + t), vfloor, _CMP_NLE_UQ);
        if (m) {
            return t + __builtin_ctz(m);
        }
    }
    return above_scalar(logits, t, n_vocab, floor);
}

STACKD_ROW_AVX2 float max_avx2(const float * logits, int32_t n_vocab) {
    __m256 acc = _mm256_set1_ps(logits[0]);
    int32_t i = 0;
    for (; i + 8 <= n_vocab; i += 8) {
        acc = _mm256_max_ps(_mm256_loadu_ps(logits + i), acc);
    }
    if (std::isnan(logits[0])) {
        return logits[0];
    }
    float part[8];
    _mm256_storeu_ps(part, acc);
    float max = part[0];
    for (float v : part) {
        max = v > max ? v : max;
    }
    for (; i < n_vocab; ++i) {
        max = logits[i] > max ? logits[i] : max;
    }
    return max;
}

namespace {

STACKD_ROW_AVX2 inline __m256 exp_avx2(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    const __m256 round = _mm256_set1_ps(12582912.0f);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), round), round);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145751953125f))),
                                   _mm256_mul_ps(n, _mm256_set1_ps(1.428606765330187e-06f)));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace

STACKD_ROW_AVX2 void lanes_avx2(const float * logits, int32_t n_blocks, float max, float * lanes) {
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 lo = _mm256_loadu_ps(lanes), hi = _mm256_loadu_ps(lanes + 8);
    for (int32_t b = 0; b < n_blocks; ++b) {
        lo = _mm256_add_ps(lo, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(logits + b * k_lanes), vmax)));
        hi = _mm256_add_ps(hi, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(logits + b * k_lanes + 8), vmax)));
    }
    _mm256_storeu_ps(lanes, lo);
    _mm256_storeu_ps(lanes + 8, hi);
}

STACKD_ROW_AVX2 int32_t above_avx2(const float * logits, int32_t from, int32_t n_vocab, float floor) {
    const __m256 vfloor = _mm256_set1_ps(floor);
    int32_t t = from;
    for (; t + 8 <= n_vocab; t += 8) {
        const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(logits + t), vfloor, _CMP_NLE_UQ));
        if (m) {
            return t + __builtin_ctz(m);
        }
    }
    return above_scalar(logits, t, n_vocab, floor);
}

}  // namespace sampling_rows
