// Helpers of the AVX-512 paths (gemm_avx512.cpp: Q4_1 and Q8_0). Include after the
// file's `#pragma GCC target` line: these inline functions take the includer's target.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "layout.h"
#include "tiles.h"

namespace stackd {
namespace avx512 {

// Activation bytes 4*chunk .. 4*chunk+3 of a block as one int32, to broadcast.
inline int32_t quad(const ActBlock &a, int chunk) {
    int32_t v;
    std::memcpy(&v, a.q + 4 * chunk, sizeof v);
    return v;
}

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

// Each row's exact block sum: u[c] holds four weight bytes per row (unsigned), matched with
// activation bytes 4c .. 4c+3; `start` is the integer the sum starts from. Two chains of four
// vpdpbusd keep the adder busy; integer sums are exact in any order (kernels.h).
inline __m512i block_dot(const __m512i *u, const ActBlock &a, __m512i start = _mm512_setzero_si512()) {
    __m512i even = _mm512_dpbusd_epi32(start, u[0], _mm512_set1_epi32(quad(a, 0)));
    __m512i odd = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[1], _mm512_set1_epi32(quad(a, 1)));
    for (int c = 2; c < 8; c += 2) {
        even = _mm512_dpbusd_epi32(even, u[c], _mm512_set1_epi32(quad(a, c)));
        odd = _mm512_dpbusd_epi32(odd, u[c + 1], _mm512_set1_epi32(quad(a, c + 1)));
    }
    return _mm512_add_epi32(even, odd);
}

inline __m256i block_dot(const __m256i *u, const ActBlock &a, __m256i start = _mm256_setzero_si256()) {
    __m256i even = _mm256_dpbusd_epi32(start, u[0], _mm256_set1_epi32(quad(a, 0)));
    __m256i odd = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u[1], _mm256_set1_epi32(quad(a, 1)));
    for (int c = 2; c < 8; c += 2) {
        even = _mm256_dpbusd_epi32(even, u[c], _mm256_set1_epi32(quad(a, c)));
        odd = _mm256_dpbusd_epi32(odd, u[c + 1], _mm256_set1_epi32(quad(a, c + 1)));
    }
    return _mm256_add_epi32(even, odd);
}

}  // namespace avx512
}  // namespace stackd
