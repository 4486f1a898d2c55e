// The reference path: plain C++, the arithmetic every SIMD path reproduces (kernels.h).
#include <cmath>

#include "ggml.h"
#include "kernels.h"

namespace stackd {

namespace {

// The exact int32 dot product of row r's block with one activation block.
int32_t block_dot(const Q4x8Block &w, int r, const ActBlock &a) {
    int32_t sum = 0;
    for (int chunk = 0; chunk < 8; chunk++) {
        const int shift = chunk >= 4 ? 4 : 0;
        for (int i = 0; i < 4; i++) {
            const int u = (w.qs[32 * (chunk % 4) + 4 * r + i] >> shift) & 0x0F;
            sum += u * a.q[4 * chunk + i];
        }
    }
    return sum;
}

}  // namespace

void gemm_scalar(const Q4x8Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                 const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    for (int64_t g = g_begin; g < g_end; g++) {
        const Q4x8Block *wg = w + g * nb;
        for (int64_t t = 0; t < n_tokens; t++) {
            const ActBlock *a = act + t * nb;
            float acc[kRowsPerGroup] = {};
            for (int64_t b = 0; b < nb; b++) {
                for (int r = 0; r < kRowsPerGroup; r++) {
                    const float dw = ggml_fp16_to_fp32(wg[b].d[r]);
                    const float mw = ggml_fp16_to_fp32(wg[b].m[r]);
                    const float scale = dw * a[b].d;
                    acc[r] = std::fma(scale, (float)block_dot(wg[b], r, a[b]), acc[r]);
                    acc[r] = std::fma(mw, a[b].s, acc[r]);
                }
            }
            store_group(dst + t * dst_stride, acc, g * kRowsPerGroup, rows);
        }
    }
}

GemmFn gemm_for(Path path) {
    switch (path) {
        case Path::Avx512: return gemm_avx512;
        case Path::Avx2: return gemm_avx2;
        case Path::Scalar: break;
    }
    return gemm_scalar;
}

}  // namespace stackd
