// Helpers the AVX-512 paths share (gemm_avx512.cpp, gemm_q8_0_avx512.cpp). Include after the
// file's `#pragma GCC target` line: these inline functions take the includer's target.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "layout.h"

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

// ggml's horizontal-add order over a row's eight partial sums (kernels.h), for 16 or 8 rows.
inline __m512 reduce_lanes(const __m512 *l) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6])),
                         _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7])));
}

inline __m256 reduce_lanes(const __m256 *l) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                         _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
}

}  // namespace avx512
}  // namespace stackd
