#include "matmul.h"

#include <omp.h>

#include <algorithm>

namespace stackd {

bool can_serve(const ggml_tensor *op) {
    const ggml_tensor *w = op->src[0], *x = op->src[1];
    return op->op == GGML_OP_MUL_MAT && w->type == GGML_TYPE_Q4_1 && w->view_src == nullptr &&
           w->ne[2] == 1 && w->ne[3] == 1 && w->ne[0] % kQK == 0 && ggml_is_contiguous(w) &&
           (x->type == GGML_TYPE_F32 || x->type == GGML_TYPE_F16) &&
           x->nb[0] == ggml_type_size(x->type) && op->type == GGML_TYPE_F32 &&
           op->nb[0] == sizeof(float) && op->nb[1] % sizeof(float) == 0;
}

namespace {

// One token's activation row (F32 or F16) into ActBlocks; buf holds a converted F16 row.
void quantize_token(const ggml_tensor *x, const char *row, int64_t k, ActBlock *out,
                    std::vector<float> &buf) {
    if (x->type == GGML_TYPE_F32) {
        quantize_row(reinterpret_cast<const float *>(row), k, out);
        return;
    }
    buf.resize(k);
    ggml_fp16_to_fp32_row(reinterpret_cast<const ggml_fp16_t *>(row), buf.data(), k);
    quantize_row(buf.data(), k, out);
}

// Groups [begin, end) of thread ith among nth. Chunks hold an even number of groups so
// the AVX-512 path can pair them; where a row lands never changes its arithmetic.
void split_groups(int64_t groups, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = (groups + nth - 1) / nth;
    per += per & 1;
    *begin = std::min(groups, per * ith);
    *end = std::min(groups, *begin + per);
}

}  // namespace

void mul_mat(ggml_tensor *dst, Path path, int n_threads, std::vector<ActBlock> &scratch) {
    const ggml_tensor *w = dst->src[0], *x = dst->src[1];
    const int64_t k = w->ne[0], rows = w->ne[1], nb = k / kQK, groups = row_groups(rows);
    const int64_t tokens = x->ne[1], planes2 = x->ne[2], planes3 = x->ne[3];
    const auto *weights = static_cast<const Q4x8Block *>(w->data);
    const GemmFn gemm = gemm_for(path);
    if (scratch.size() < (size_t)(tokens * nb)) scratch.resize(tokens * nb);
    ActBlock *act = scratch.data();
    const int nth = (int)std::max<int64_t>(1, std::min<int64_t>(n_threads, groups));

#pragma omp parallel num_threads(nth)
    {
        const int ith = omp_get_thread_num(), team = omp_get_num_threads();
        std::vector<float> buf;
        int64_t g_begin, g_end;
        split_groups(groups, ith, team, &g_begin, &g_end);
        for (int64_t i3 = 0; i3 < planes3; i3++) {
            for (int64_t i2 = 0; i2 < planes2; i2++) {
                const char *xp = static_cast<const char *>(x->data) + i2 * x->nb[2] + i3 * x->nb[3];
                for (int64_t t = ith; t < tokens; t += team)
                    quantize_token(x, xp + t * x->nb[1], k, act + t * nb, buf);
#pragma omp barrier
                float *out = reinterpret_cast<float *>(static_cast<char *>(dst->data) +
                                                        i2 * dst->nb[2] + i3 * dst->nb[3]);
                if (g_begin < g_end)
                    gemm(weights, nb, rows, g_begin, g_end, act, tokens, out,
                         (int64_t)(dst->nb[1] / sizeof(float)));
#pragma omp barrier
            }
        }
    }
}

}  // namespace stackd
