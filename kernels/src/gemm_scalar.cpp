// The reference paths: plain C++, the arithmetic every SIMD path reproduces (kernels.h).
#include <cmath>

#include "ggml.h"
#include "kernels.h"
#include "tiles.h"

namespace stackd {

namespace {

// The exact int32 dot product of row r's block with the activation block.
int32_t block_dot(const Q4x8Block &w, int r, const ActBlock &a) {
    int32_t sum = 0;
    for (int chunk = 0; chunk < 8; chunk++) {
        const int shift = chunk >= 4 ? 4 : 0;
        for (int i = 0; i < 4; i++)
            sum += ((w.qs[32 * (chunk % 4) + 4 * r + i] >> shift) & 0x0F) * a.q[4 * chunk + i];
    }
    return sum;
}

int32_t block_dot(const Q8x8Block &w, int r, const ActBlock &a) {
    int32_t sum = 0;
    for (int chunk = 0; chunk < 8; chunk++)
        for (int i = 0; i < 4; i++) sum += ((int)w.qs[32 * chunk + 4 * r + i] - 128) * a.q[4 * chunk + i];
    return sum;
}

// One row against one token (kernels.h).
float row_dot(const Q4x8Block *wg, int64_t nb, int r, const ActBlock *a) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const float scale = ggml_fp16_to_fp32(wg[b].d[r]) * a[b].d;
        acc = std::fma(scale, (float)block_dot(wg[b], r, a[b]), acc);
        acc = std::fma(ggml_fp16_to_fp32(wg[b].m[r]), a[b].s, acc);
    }
    return acc;
}

float row_dot(const Q8x8Block *wg, int64_t nb, int r, const ActBlock *a) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const float scale = ggml_fp16_to_fp32(wg[b].d[r]) * a[b].d;
        acc = std::fma(scale, (float)block_dot(wg[b], r, a[b]), acc);
    }
    return acc;
}

}  // namespace

// One token at a time, one row at a time, through the same driver as the SIMD paths.
template <class Block>
void gemm_scalar(const Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                 const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    tiles::for_groups<1>(g_begin, g_end, rows, n_tokens, dst, dst_stride,
                         [=](auto, int64_t g, int64_t t, float *out) {
                             for (int r = 0; r < kRowsPerGroup; r++) out[r] = row_dot(w + g * nb, nb, r, act + t * nb);
                         });
}

Kernels kernels_for(Path path) {
    switch (path) {
        case Path::Avx512: return {gemm_avx512, gemm_q8_0_avx512};
        case Path::Avx2: return {gemm_avx2<Q4x8Block>, gemm_avx2<Q8x8Block>};
        case Path::Scalar: break;
    }
    return {gemm_scalar<Q4x8Block>, gemm_scalar<Q8x8Block>};
}

}  // namespace stackd
