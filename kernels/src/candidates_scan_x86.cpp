// The candidates scan's x86 bodies (candidates_scan.h), each compiled for its target by
// attribute; chosen by CPUID (cpu_features.cpp).
#include <immintrin.h>

#include "candidates_scan.h"

namespace stackd {

__attribute__((target("avx512f"))) int64_t above_avx512(const float *x, int64_t from, int64_t n, float floor) {
    const __m512 f = _mm512_set1_ps(floor);
    int64_t i = from;
    for (; i + 16 <= n; i += 16) {
        const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), f, _CMP_GT_OQ);
        if (m) return i + __builtin_ctz(m);
    }
    return above_scalar(x, i, n, floor);
}

__attribute__((target("avx2"))) int64_t above_avx2(const float *x, int64_t from, int64_t n, float floor) {
    const __m256 f = _mm256_set1_ps(floor);
    int64_t i = from;
    for (; i + 8 <= n; i += 8) {
        const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), f, _CMP_GT_OQ));
        if (m) return i + __builtin_ctz(m);
    }
    return above_scalar(x, i, n, floor);
}

}  // namespace stackd
