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

// What the scratch currently holds: the activations of one plane of one tensor.
struct Quantized {
    const void *data = nullptr;
    const ggml_tensor *like = nullptr;

    bool holds(const ggml_tensor *x, const void *plane) const {
        return data == plane && like != nullptr && like->type == x->type &&
               like->ne[0] == x->ne[0] && like->ne[1] == x->ne[1] && like->nb[1] == x->nb[1];
    }
};

// One node's share for thread ith of the team (every thread runs this for every node).
void run_node(ggml_tensor *dst, GemmFn gemm, ActBlock *act, Quantized &held, int ith, int nth,
              std::vector<float> &buf) {
    const ggml_tensor *w = dst->src[0], *x = dst->src[1];
    const int64_t k = w->ne[0], rows = w->ne[1], nb = k / kQK;
    const int64_t tokens = x->ne[1];
    int64_t g_begin, g_end;
    split_groups(row_groups(rows), ith, nth, &g_begin, &g_end);
    for (int64_t i3 = 0; i3 < x->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < x->ne[2]; i2++) {
            const char *plane = static_cast<const char *>(x->data) + i2 * x->nb[2] + i3 * x->nb[3];
            if (!held.holds(x, plane)) {
                for (int64_t t = ith; t < tokens; t += nth)
                    quantize_token(x, plane + t * x->nb[1], k, act + t * nb, buf);
                held = {plane, x};
#pragma omp barrier
            }
            float *out = reinterpret_cast<float *>(static_cast<char *>(dst->data) +
                                                    i2 * dst->nb[2] + i3 * dst->nb[3]);
            if (g_begin < g_end)
                gemm(static_cast<const Q4x8Block *>(w->data), nb, rows, g_begin, g_end, act,
                     tokens, out, (int64_t)(dst->nb[1] / sizeof(float)));
            // Every thread is done reading the scratch (and writing dst, which a later node
            // may read) before anyone moves on.
#pragma omp barrier
        }
    }
}

}  // namespace

void mul_mat_nodes(ggml_tensor *const *nodes, int n_nodes, Path path, int n_threads,
                   std::vector<ActBlock> &scratch) {
    size_t need = 0;
    int64_t max_groups = 1;
    for (int i = 0; i < n_nodes; i++) {
        const ggml_tensor *w = nodes[i]->src[0], *x = nodes[i]->src[1];
        need = std::max(need, (size_t)(x->ne[1] * (w->ne[0] / kQK)));
        max_groups = std::max(max_groups, row_groups(w->ne[1]));
    }
    if (scratch.size() < need) scratch.resize(need);
    ActBlock *act = scratch.data();
    const GemmFn gemm = gemm_for(path);
    const int nth = (int)std::max<int64_t>(1, std::min<int64_t>(n_threads, max_groups));

#pragma omp parallel num_threads(nth)
    {
        const int ith = omp_get_thread_num(), team = omp_get_num_threads();
        std::vector<float> buf;
        Quantized held;  // each thread tracks the same history, so all agree on skipping
        for (int i = 0; i < n_nodes; i++) {
            // A node whose activations are a previous node's output must re-quantize.
            for (int j = 0; j < i; j++)
                if (nodes[j]->data == held.data) held = {};
            run_node(nodes[i], gemm, act, held, ith, team, buf);
        }
    }
}

}  // namespace stackd
