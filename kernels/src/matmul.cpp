#include "matmul.h"

#include <algorithm>

namespace stackd {

void share(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    *begin = n * ith / nth;
    *end = n * (ith + 1) / nth;
}

bool can_serve(const ggml_tensor *op) {
    const ggml_tensor *w = op->src[0], *x = op->src[1];
    return op->op == GGML_OP_MUL_MAT && is_repacked_type(w->type) && w->view_src == nullptr &&
           w->ne[2] == 1 && w->ne[3] == 1 && w->ne[0] % kQK == 0 && ggml_is_contiguous(w) &&
           (x->type == GGML_TYPE_F32 || x->type == GGML_TYPE_F16) &&
           x->nb[0] == ggml_type_size(x->type) && op->type == GGML_TYPE_F32 &&
           op->nb[0] == sizeof(float) && op->nb[1] % sizeof(float) == 0;
}

size_t activation_blocks(const ggml_tensor *dst) {
    const ggml_tensor *x = dst->src[1];
    return (size_t)(x->ne[1] * x->ne[2] * x->ne[3]) * (size_t)(x->ne[0] / kQK);
}

namespace {

// Activation blocks [begin, end) (numbered token by token over every plane) into act.
// Q8_1 scales are per block of 32, so any block range quantizes as the whole row would.
void quantize_blocks(const ggml_tensor *x, int64_t begin, int64_t end, ActBlock *act) {
    const int64_t nb = x->ne[0] / kQK, tokens = x->ne[1], planes2 = x->ne[2];
    float converted[kQK];
    for (int64_t b = begin; b < end;) {
        const int64_t row = b / nb, first = b % nb;
        const int64_t count = std::min(nb - first, end - b);
        const int64_t t = row % tokens, i2 = (row / tokens) % planes2, i3 = row / (tokens * planes2);
        const char *src = static_cast<const char *>(x->data) + t * x->nb[1] + i2 * x->nb[2] + i3 * x->nb[3];
        if (x->type == GGML_TYPE_F32) {
            quantize_row(reinterpret_cast<const float *>(src) + first * kQK, count * kQK, act + b);
        } else {
            const auto *half = reinterpret_cast<const ggml_fp16_t *>(src) + first * kQK;
            for (int64_t i = 0; i < count; i++) {
                ggml_fp16_to_fp32_row(half + i * kQK, converted, kQK);
                quantize_row(converted, kQK, act + b + i);
            }
        }
        b += count;
    }
}

}  // namespace

void mul_mat_share(ggml_tensor *dst, Kernels kernels, Activations &act, uint64_t epoch, int ith, int nth) {
    const ggml_tensor *w = dst->src[0], *x = dst->src[1];
    const int64_t k = w->ne[0], rows = w->ne[1], nb = k / kQK, tokens = x->ne[1];
    // Every thread reads the same history, so all agree on whether to quantize; thread 0
    // records the new one only after the barrier, once nobody reads it for this node.
    if (act.held != x || act.held_epoch != epoch) {
        int64_t begin, end;
        share((int64_t)activation_blocks(dst), ith, nth, &begin, &end);
        quantize_blocks(x, begin, end, act.blocks.data());
#pragma omp barrier
        if (ith == 0) {
            act.held = x;
            act.held_epoch = epoch;
        }
    }
    int64_t g_begin, g_end;
    share(row_groups(rows), ith, nth, &g_begin, &g_end);
    if (g_begin >= g_end) return;
    for (int64_t i3 = 0; i3 < x->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < x->ne[2]; i2++) {
            const ActBlock *plane = act.blocks.data() + ((i3 * x->ne[2] + i2) * tokens) * nb;
            float *out = reinterpret_cast<float *>(static_cast<char *>(dst->data) +
                                                    i2 * dst->nb[2] + i3 * dst->nb[3]);
            const int64_t stride = (int64_t)(dst->nb[1] / sizeof(float));
            if (w->type == GGML_TYPE_Q8_0) {
                kernels.q8_0(static_cast<const Q8x8Block *>(w->data), nb, rows, g_begin, g_end, plane,
                             tokens, out, stride);
            } else {
                kernels.q4_1(static_cast<const Q4x8Block *>(w->data), nb, rows, g_begin, g_end, plane,
                             tokens, out, stride);
            }
        }
    }
}

}  // namespace stackd
