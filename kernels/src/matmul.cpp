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
           w->ne[2] == 1 && w->ne[3] == 1 && w->ne[0] % block_length(w->type) == 0 && ggml_is_contiguous(w) &&
           (x->type == GGML_TYPE_F32 || x->type == GGML_TYPE_F16) &&
           x->nb[0] == ggml_type_size(x->type) && op->type == GGML_TYPE_F32 &&
           op->nb[0] == sizeof(float) && op->nb[1] % sizeof(float) == 0;
}

size_t activation_blocks(const ggml_tensor *dst) {
    const ggml_tensor *x = dst->src[1];
    return (size_t)(x->ne[1] * x->ne[2] * x->ne[3]) * (size_t)(x->ne[0] / block_length(dst->src[0]->type));
}

void reserve_activations(Activations &act, const ggml_tensor *dst) {
    const size_t need = activation_blocks(dst);
    if (is_k_quant(dst->src[0]->type)) {
        if (act.kblocks.size() < need) act.kblocks.resize(need);
    } else if (act.blocks.size() < need) {
        act.blocks.resize(need);
    }
}

namespace {

void quantize(const float *x, int64_t k, ActBlock *out) { quantize_row(x, k, out); }
void quantize(const float *x, int64_t k, ActKBlock *out) { quantize_row_k(x, k, out); }

// Activation blocks [begin, end) (numbered token by token over every plane) into act.
// Scales are per block (32 or 256), so any block range quantizes as the whole row would.
template <class Block>
void quantize_blocks(const ggml_tensor *x, int64_t begin, int64_t end, Block *act) {
    constexpr int64_t kLength = sizeof(Block::q);
    const int64_t nb = x->ne[0] / kLength, tokens = x->ne[1], planes2 = x->ne[2];
    float converted[kLength];
    for (int64_t b = begin; b < end;) {
        const int64_t row = b / nb, first = b % nb;
        const int64_t count = std::min(nb - first, end - b);
        const int64_t t = row % tokens, i2 = (row / tokens) % planes2, i3 = row / (tokens * planes2);
        const char *src = static_cast<const char *>(x->data) + t * x->nb[1] + i2 * x->nb[2] + i3 * x->nb[3];
        if (x->type == GGML_TYPE_F32) {
            quantize(reinterpret_cast<const float *>(src) + first * kLength, count * kLength, act + b);
        } else {
            const auto *half = reinterpret_cast<const ggml_fp16_t *>(src) + first * kLength;
            for (int64_t i = 0; i < count; i++) {
                ggml_fp16_to_fp32_row(half + i * kLength, converted, kLength);
                quantize(converted, kLength, act + b + i);
            }
        }
        b += count;
    }
}

// The node's activations in the scratch of their kind (quantized by this computation's first
// node that reads them). Every thread reads the same history, so all agree on whether to
// quantize; thread 0 records the new one only after the barrier, once nobody reads it.
template <class Block>
const Block *quantized(const ggml_tensor *dst, std::vector<Block> &blocks, const ggml_tensor *&held,
                       uint64_t &held_epoch, uint64_t epoch, int ith, int nth) {
    const ggml_tensor *x = dst->src[1];
    if (held != x || held_epoch != epoch) {
        int64_t begin, end;
        share((int64_t)activation_blocks(dst), ith, nth, &begin, &end);
        quantize_blocks(x, begin, end, blocks.data());
#pragma omp barrier
        if (ith == 0) {
            held = x;
            held_epoch = epoch;
        }
    }
    return blocks.data();
}

// The repacked weight's kernel over every plane of the activations.
// (A chunked product's doubles are for 2-D products only: mul_mat_share's contract.)
template <class Block, class ActType, class Gemm>
void run_planes(ggml_tensor *dst, Gemm gemm, const ActType *act, int64_t g_begin, int64_t g_end,
                const Chunked &chunked) {
    const ggml_tensor *w = dst->src[0], *x = dst->src[1];
    const int64_t nb = w->ne[0] / (int64_t)sizeof(ActType::q), rows = w->ne[1], tokens = x->ne[1];
    GemmOut out;
    out.stride = (int64_t)(dst->nb[1] / sizeof(float));
    out.chunk = chunked.columns > 0 ? std::max<int64_t>(1, chunked.columns / (int64_t)sizeof(ActType::q)) : 0;
    for (int64_t i3 = 0; i3 < x->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < x->ne[2]; i2++) {
            const ActType *plane = act + ((i3 * x->ne[2] + i2) * tokens) * nb;
            out.f32 = reinterpret_cast<float *>(static_cast<char *>(dst->data) + i2 * dst->nb[2] + i3 * dst->nb[3]);
            out.f64 = i2 == 0 && i3 == 0 ? chunked.f64 : nullptr;
            gemm(static_cast<const Block *>(w->data), nb, rows, g_begin, g_end, plane, tokens, out);
        }
    }
}

}  // namespace

QuantizedInput mul_mat_input(const ggml_tensor *dst, Activations &act, uint64_t epoch, int ith, int nth) {
    QuantizedInput input;
    if (is_k_quant(dst->src[0]->type)) input.kblocks = quantized(dst, act.kblocks, act.held_k, act.held_k_epoch, epoch, ith, nth);
    else input.blocks = quantized(dst, act.blocks, act.held, act.held_epoch, epoch, ith, nth);
    return input;
}

void mul_mat_share(ggml_tensor *dst, Kernels kernels, Activations &act, uint64_t epoch, int ith, int nth,
                   int64_t row_begin, int64_t row_end, const Chunked &chunked) {
    mul_mat_rows(dst, kernels, mul_mat_input(dst, act, epoch, ith, nth), ith, nth, row_begin, row_end, chunked);
}

void mul_mat_rows(ggml_tensor *dst, Kernels kernels, const QuantizedInput &input, int ith, int nth,
                  int64_t row_begin, int64_t row_end, const Chunked &chunked) {
    const ggml_type type = dst->src[0]->type;
    const ActBlock *blocks = input.blocks;
    const ActKBlock *kblocks = input.kblocks;
    const int64_t first = row_begin / kRowsPerGroup;
    const int64_t last = row_end < 0 ? row_groups(dst->src[0]->ne[1]) : row_groups(row_end);
    int64_t g_begin, g_end;
    share(last - first, ith, nth, &g_begin, &g_end);
    g_begin += first;
    g_end += first;
    if (g_begin >= g_end) return;
    switch (type) {
        case GGML_TYPE_Q8_0: run_planes<Q8x8Block>(dst, kernels.q8_0, blocks, g_begin, g_end, chunked); break;
        case GGML_TYPE_Q4_0: run_planes<Q40x8Block>(dst, kernels.q4_0, blocks, g_begin, g_end, chunked); break;
        case GGML_TYPE_Q5_0: run_planes<Q50x8Block>(dst, kernels.q5_0, blocks, g_begin, g_end, chunked); break;
        case GGML_TYPE_Q5_1: run_planes<Q51x8Block>(dst, kernels.q5_1, blocks, g_begin, g_end, chunked); break;
        case GGML_TYPE_Q4_K: run_planes<Q4Kx8Block>(dst, kernels.kquants.q4_k, kblocks, g_begin, g_end, chunked); break;
        case GGML_TYPE_Q5_K: run_planes<Q5Kx8Block>(dst, kernels.kquants.q5_k, kblocks, g_begin, g_end, chunked); break;
        case GGML_TYPE_Q6_K: run_planes<Q6Kx8Block>(dst, kernels.kquants.q6_k, kblocks, g_begin, g_end, chunked); break;
        default: run_planes<Q4x8Block>(dst, kernels.q4_1, blocks, g_begin, g_end, chunked); break;
    }
}

}  // namespace stackd
