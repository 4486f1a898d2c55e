// MUL_MAT on weights in our repacked buffer, run as one node of ggml's own CPU graph
// computation: every thread of ggml's team calls mul_mat_share for the node with its
// index, quantizes its share of the activations, meets the others at one barrier, then runs
// the chosen path's kernel over its share of the row groups.
#pragma once

#include <cstdint>
#include <vector>

#include "ggml.h"
#include "kernels.h"

namespace stackd {

// The weight types our buffer repacks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants Q4_K,
// Q5_K and Q6_K: kernels_qk.h).
inline bool is_repacked_type(ggml_type type) {
    return type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1 ||
           type == GGML_TYPE_Q8_0 ||
           type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K;
}

// Weights per block of a type we repack along K (32, or 256 for the K-quants).
inline int64_t block_length(ggml_type type) { return (int64_t)ggml_blck_size(type); }

// [begin, end) of n items (activation blocks, row groups, rows) for thread ith among nth, as
// even as integers allow. Where an item lands never changes its arithmetic: each row's result
// and each block's quantization stand alone, and a tile of two row groups may start at any group.
void share(int64_t n, int ith, int nth, int64_t *begin, int64_t *end);

// Whether we can compute this MUL_MAT node given its weight is repacked (shape and types).
bool can_serve(const ggml_tensor *op);

// What a backend's scratch holds: the quantized activations of one tensor, as of one graph
// computation (a reused graph brings the same tensors back with new contents).
// K-quant weights read Q8_K super-blocks (kblocks), the others Q8_1 blocks (blocks), each
// with its own record of what it holds.
struct Activations {
    std::vector<ActBlock> blocks;
    const ggml_tensor *held = nullptr;
    uint64_t held_epoch = 0;
    std::vector<ActKBlock> kblocks;
    const ggml_tensor *held_k = nullptr;
    uint64_t held_k_epoch = 0;
};

// Activation blocks the node needs (all its planes' tokens), of its weight's kind.
size_t activation_blocks(const ggml_tensor *dst);

// Grows the scratch for the node; called before the threads start, never inside the
// parallel region.
void reserve_activations(Activations &act, const ggml_tensor *dst);

// Thread ith of nth's part of dst = mul_mat(src[0] (repacked Q4_1 or Q8_0), src[1]). Consecutive
// nodes reading the same activations in one computation (q, k, v; gate, up) quantize them
// once. Must be called by all nth threads of the enclosing OpenMP team. Only the weight's rows
// [row_begin, row_end) are computed when given (row_end -1: all; both multiples of 8 but the
// last row): a tensor-parallel rank's part of the vocabulary projection (tp.h); dst's other
// rows are left as they were.
// chunked: the product in the chunked form (kernels.h, GemmOut) with runs of `columns` weights
// along K (rounded to whole blocks of the weight's type, at least one), and when f64 is given
// (2-D products only) its rows before rounding, laid out as dst's.
struct Chunked {
    int64_t columns = 0;       // 0: the plain form
    double *f64 = nullptr;
};
void mul_mat_share(ggml_tensor *dst, Kernels kernels, Activations &act, uint64_t epoch, int ith, int nth,
                   int64_t row_begin = 0, int64_t row_end = -1, const Chunked &chunked = {});

// mul_mat_share's two halves, for one node that computes several products of the same
// activations (fusion.h: q, k and v; gate and up): the activations quantized once (every thread,
// one barrier), then each product's rows with no barrier between them.
struct QuantizedInput {
    const ActBlock *blocks = nullptr;    // the plain types' Q8_1 blocks
    const ActKBlock *kblocks = nullptr;  // the K-quants' Q8_K super-blocks
};
QuantizedInput mul_mat_input(const ggml_tensor *dst, Activations &act, uint64_t epoch, int ith, int nth);
void mul_mat_rows(ggml_tensor *dst, Kernels kernels, const QuantizedInput &input, int ith, int nth,
                  int64_t row_begin = 0, int64_t row_end = -1, const Chunked &chunked = {});

}  // namespace stackd
