// The scan under a tensor split's logits candidates (tp_backend.cpp, select_candidates): the first
// logit above the current k-th best. A comparison is exact, so every path finds the same index
// (kernels/check/paths_check.cpp holds each to the scalar one); the SIMD ones compare 16 (AVX-512),
// 8 (AVX2) or 4 x 4 (NEON) at a time.
#pragma once

#include <cstdint>

#include "cpu_features.h"

namespace stackd {

// The first index from `from` on whose value is above `floor` (NaN never is), or n.
using AboveFn = int64_t (*)(const float *x, int64_t from, int64_t n, float floor);

int64_t above_scalar(const float *x, int64_t from, int64_t n, float floor);
int64_t above_avx2(const float *x, int64_t from, int64_t n, float floor);     // candidates_scan_x86.cpp
int64_t above_avx512(const float *x, int64_t from, int64_t n, float floor);   // candidates_scan_x86.cpp
int64_t above_neon(const float *x, int64_t from, int64_t n, float floor);     // candidates_scan_neon.cpp

// A path's scan (the build's own architecture's; scalar for any other path).
AboveFn above_for(Path path);

}  // namespace stackd
