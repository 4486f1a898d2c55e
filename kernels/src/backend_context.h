// Private to our backend's two files: backend.cpp (the buffers, the devices, graph compute and
// the chunked form) and tp_backend.cpp (a tensor split's nodes: the partial sums' all-reduce and
// the logits' rows and candidates). What one backend holds, and what each file asks of the other.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "backend.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "matmul.h"
#include "tp.h"

namespace stackd::backend_detail {

// ---- backend: the whole graph on ggml's CPU backend, our MUL_MATs inside it (backend.cpp) ----

struct BackendContext {
    int n_threads = 1;
    int fixed_path = -1;  // -1: follow the process-wide path
    bool served = false;  // the device an RPC server serves (weights in served buffers)
    ggml_backend_t cpu = nullptr;
    Activations act;
    uint64_t epoch = 0;
    struct Swapped {                   // a node of ours, with what to put back
        ggml_tensor *node;
        ggml_op op;
        std::array<int32_t, GGML_MAX_OP_PARAMS / sizeof(int32_t)> params;
    };
    std::vector<Swapped> swapped;
    std::set<ggml_backend_buffer_t> advised;  // buffers marked for huge pages (advise_buffer)
    std::atomic<uint64_t> tp_generation{0};   // the tensor-parallel group the running graph began in (0: none)
    std::vector<tp::Candidate> candidates;    // a follower's picks of the logits rows (logits_task)
    // In a tensor-parallel group, the last chunked product's sums before rounding (its node in
    // partial_of): the partial sum the residual add after it exchanges (allreduce_task).
    std::vector<double> partial;
    const ggml_tensor *partial_of = nullptr;
    std::vector<double> partial_rows;         // the rows a GET_ROWS between them picked
    // This graph's fused nodes (fusion.h), each task's record by index.
    struct Fusions {
        struct Norm {                          // [add ->] norm -> mul by weight
            ggml_tensor *add;                  // null: the norm alone
            ggml_tensor *norm;
            ggml_tensor *mul;
            const ggml_tensor *weight;
            float eps;
            bool weight_first;                 // mul(weight, norm), as ggml multiplies
        };
        static constexpr int kMaxProducts = 4;     // q, k and v; gate and up
        struct Group {                         // products of the same activations
            ggml_tensor *products[kMaxProducts];
            int n = 0;
        };
        std::vector<Norm> norms;
        std::vector<Group> groups;
    } fusions;
};

inline Kernels kernels_of(const BackendContext *ctx) {
    return kernels_for(ctx->fixed_path >= 0 ? (Path)ctx->fixed_path : current_path());
}

// Whether a MUL_MAT or GET_ROWS node is on our kernels (backend.cpp).
bool ours(const BackendContext *ctx, const ggml_tensor *node);

// ---- a tensor split's nodes (tp_backend.cpp) ----

// Whether the graph running on this backend belongs to a tensor-parallel group that failed or
// was left meanwhile: ggml's abort callback then skips its remaining nodes.
bool tp_lost(const BackendContext *ctx);
// A residual add's exchange of this node's partial sum (a GGML_OP_CUSTOM task of one thread).
void allreduce_task(ggml_tensor *dst, int ith, int nth, void *userdata);
// The vocabulary projection: this rank's rows, gathered to rank 0 (every thread of ggml's team).
void logits_task(ggml_tensor *dst, int ith, int nth, void *userdata);
// `ffn_inp-<il>` or `l_out-<il>`: llama.cpp's names (cb) for a layer's two residual adds.
bool residual_add_name(const char *name);
// "" when a residual add, or the vocabulary projection, can be exchanged as it is; else why not.
std::string residual_add_problem(const ggml_tensor *node);
std::string logits_problem(const BackendContext *ctx, const ggml_tensor *node);

}  // namespace stackd::backend_detail
