// One matmul, ours or ggml's, for counting the instructions it retires under qemu-aarch64
// (tests/kernels/aarch64_count.py: TCG one instruction a block, its exec log filtered to the
// op's code). Emulation says nothing of speed; the count says how much work each does.
//
//     ops_count ours|ggml TYPE ROWS K TOKENS
//
// ours: the activations quantized (quantize_row) and the path's kernel over every row group,
// one thread (kernels_for(best_path())). ggml: a MUL_MAT graph of the same shape computed by
// ggml's CPU backend on one thread (ggml_graph_compute_with_ctx), from the same plain ggml
// weights: its from_float and vec_dot (or llamafile's sgemm), without its run-time repack (that
// needs ggml's extra buffer types, which llama.cpp's loader chooses). Weights are random ggml
// blocks with sane fp16 scales, as in paths_check.cpp.
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"
#include "kernels.h"
#include "kernels_qk.h"
#include "layout.h"
#include "layout_qk.h"

namespace {

using namespace stackd;

std::vector<uint8_t> random_weights(ggml_type type, int64_t rows, int64_t k) {
    std::mt19937 rng(7);
    const size_t row_bytes = ggml_row_size(type, k), block_bytes = ggml_type_size(type);
    std::vector<uint8_t> w(row_bytes * rows);
    for (auto &b : w) b = (uint8_t)rng();
    std::normal_distribution<float> normal(0.0f, 0.05f);
    // the block's fp16 scales: d (and m, or dmin) first; Q6_K's d is its last two bytes
    const bool two = type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K;
    const size_t at = type == GGML_TYPE_Q6_K ? block_bytes - 2 : 0;
    for (size_t off = 0; off < w.size(); off += block_bytes) {
        for (int h = 0; h < (two ? 2 : 1); h++) {
            const ggml_fp16_t d = ggml_fp32_to_fp16(normal(rng));
            std::memcpy(w.data() + off + at + 2 * h, &d, 2);
        }
    }
    return w;
}

ggml_type type_named(const std::string &name) {
    if (name == "q4_0") return GGML_TYPE_Q4_0;
    if (name == "q4_1") return GGML_TYPE_Q4_1;
    if (name == "q5_0") return GGML_TYPE_Q5_0;
    if (name == "q8_0") return GGML_TYPE_Q8_0;
    if (name == "q4_k") return GGML_TYPE_Q4_K;
    if (name == "q5_k") return GGML_TYPE_Q5_K;
    if (name == "q6_k") return GGML_TYPE_Q6_K;
    return GGML_TYPE_COUNT;
}

// Ours for a K-quant: the activations as Q8_K super-blocks, the path's K-quant kernel.
template <class Block>
void ours_k(void (*repack)(const void *, int64_t, int64_t, Block *), GemmKFn<Block> kernel,
            const std::vector<uint8_t> &w, const std::vector<float> &x, int64_t rows, int64_t k, int64_t tokens,
            float *y) {
    const int64_t nb = k / 256, groups = row_groups(rows);
    std::vector<Block> packed(groups * nb);
    repack(w.data(), rows, k, packed.data());
    std::vector<ActKBlock> act(tokens * nb);
    for (int64_t t = 0; t < tokens; t++) quantize_row_k(x.data() + t * k, k, act.data() + t * nb);   // counted
    kernel(packed.data(), nb, rows, 0, groups, act.data(), tokens, GemmOut{y, nullptr, rows, 0});
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 6) {
        std::fprintf(stderr, "usage: ops_count ours|ggml q4_0|q4_1|q5_0|q8_0|q4_k|q5_k|q6_k ROWS K TOKENS\n");
        return 2;
    }
    const std::string who = argv[1], name = argv[2];
    const int64_t rows = std::atoll(argv[3]), k = std::atoll(argv[4]), tokens = std::atoll(argv[5]);
    ggml_cpu_init();   // ggml's fp16 tables, as its CPU backend does at start
    const ggml_type type = type_named(name);
    if (type == GGML_TYPE_COUNT) {
        std::fprintf(stderr, "ops_count: no type %s\n", name.c_str());
        return 2;
    }
    const std::vector<uint8_t> w = random_weights(type, rows, k);
    std::vector<float> x(tokens * k), y(tokens * rows);
    std::mt19937 rng(9);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto &v : x) v = normal(rng);

    if (who == "ours" && (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K)) {
        const KQuantKernels kq = kernels_for(best_path()).kquants;
        if (type == GGML_TYPE_Q4_K) ours_k(repack_q4_k, kq.q4_k, w, x, rows, k, tokens, y.data());
        if (type == GGML_TYPE_Q5_K) ours_k(repack_q5_k, kq.q5_k, w, x, rows, k, tokens, y.data());
        if (type == GGML_TYPE_Q6_K) ours_k(repack_q6_k, kq.q6_k, w, x, rows, k, tokens, y.data());
        std::printf("ours (%s): y[0] = %g\n", path_name(best_path()), y[0]);
        return 0;
    }
    if (who == "ours") {
        const int64_t nb = k / kQK, groups = row_groups(rows);
        std::vector<uint8_t> packed;
        if (type == GGML_TYPE_Q4_0) packed.resize(groups * nb * sizeof(Q40x8Block)), repack_q4_0(w.data(), rows, k, (Q40x8Block *)packed.data());
        if (type == GGML_TYPE_Q5_0) packed.resize(groups * nb * sizeof(Q50x8Block)), repack_q5_0(w.data(), rows, k, (Q50x8Block *)packed.data());
        if (type == GGML_TYPE_Q4_1) packed.resize(groups * nb * sizeof(Q4x8Block)), repack_q4_1(w.data(), rows, k, (Q4x8Block *)packed.data());
        if (type == GGML_TYPE_Q8_0) packed.resize(groups * nb * sizeof(Q8x8Block)), repack_q8_0(w.data(), rows, k, (Q8x8Block *)packed.data());
        const Kernels kernels = kernels_for(best_path());
        std::vector<ActBlock> act(tokens * nb);
        for (int64_t t = 0; t < tokens; t++) quantize_row(x.data() + t * k, k, act.data() + t * nb);   // counted
        const GemmOut out{y.data(), nullptr, rows, 0};
        if (type == GGML_TYPE_Q4_0) kernels.q4_0((const Q40x8Block *)packed.data(), nb, rows, 0, groups, act.data(), tokens, out);
        if (type == GGML_TYPE_Q5_0) kernels.q5_0((const Q50x8Block *)packed.data(), nb, rows, 0, groups, act.data(), tokens, out);
        if (type == GGML_TYPE_Q4_1) kernels.q4_1((const Q4x8Block *)packed.data(), nb, rows, 0, groups, act.data(), tokens, out);
        if (type == GGML_TYPE_Q8_0) kernels.q8_0((const Q8x8Block *)packed.data(), nb, rows, 0, groups, act.data(), tokens, out);
        std::printf("ours (%s): y[0] = %g\n", path_name(best_path()), y[0]);
        return 0;
    }
    ggml_init_params params{w.size() + x.size() * 4 + y.size() * 4 + (64 << 20), nullptr, false};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *wt = ggml_new_tensor_2d(ctx, type, k, rows);
    ggml_tensor *xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, tokens);
    std::memcpy(wt->data, w.data(), w.size());
    std::memcpy(xt->data, x.data(), x.size() * 4);
    ggml_tensor *yt = ggml_mul_mat(ctx, wt, xt);
    ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, yt);
    ggml_graph_compute_with_ctx(ctx, graph, 1);
    std::printf("ggml: y[0] = %g\n", ((float *)yt->data)[0]);
    ggml_free(ctx);
    return 0;
}
