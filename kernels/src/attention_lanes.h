// The last steps of attention.h's sixteen-lane tree, shared by the AVX2 and AVX-512 bodies
// (each includes this under its own target pragma): eight lanes combined with the lane 4 on,
// then 2 on, then 1 on. Add sums (the order attention.h fixes); Max finds the largest (exact in
// any order).
#pragma once

#include <immintrin.h>

namespace stackd::attention_lanes {

struct Add {
    __m256 operator()(__m256 x, __m256 y) const { return _mm256_add_ps(x, y); }
    __m128 operator()(__m128 x, __m128 y) const { return _mm_add_ps(x, y); }
};

struct Max {
    __m256 operator()(__m256 x, __m256 y) const { return _mm256_max_ps(x, y); }
    __m128 operator()(__m128 x, __m128 y) const { return _mm_max_ps(x, y); }
};

template <class Combine>
inline float fold8(__m256 r8, Combine combine) {
    const __m128 r4 = combine(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    const __m128 r2 = combine(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(combine(r2, _mm_movehdup_ps(r2)));
}

}  // namespace stackd::attention_lanes
