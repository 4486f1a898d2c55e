// Where a graph's time goes on our side, for bench/roofline.py's phase table: thread 0's time in
// each kind of node of ours, and each whole graph's compute. What is left of a graph's compute
// after ours is ggml's own ops (norms, rope, adds, SwiGLU, copies into the KV cache) with the
// barriers between nodes and the idle of a thread that finished its share first (thread 0's
// share stands for the node: ggml's barrier after it holds the faster thread).
//
// Off unless a bench turns it on (stackd_kernels_profile): a node pays one relaxed load. On, two
// clock reads on thread 0 a node (~40 ns of a ~250-node step of several ms).
#pragma once

#include <atomic>
#include <cstdint>

struct ggml_tensor;

namespace stackd::profile {

enum Phase : int {
    kMatmul,      // our MUL_MATs on the layers' weights
    kLmHead,      // the vocabulary projection (llama.cpp's node "result_output")
    kAttention,   // our decode attention
    kGetRows,     // the embedding rows of the step's tokens
    kExchange,    // a tensor split's all-reduce of partial sums
    kNorms,       // fused residual adds and RMS norms with their weights (fusion.h)
    kGraph,       // a whole graph's compute on ggml's team, ours and ggml's nodes together
    kPhaseCount
};

extern std::atomic<bool> g_on;

uint64_t now_ns();
void add(Phase phase, uint64_t ns);
void add_nodes(uint64_t nodes);          // a graph's computing nodes: one barrier of ggml's each
void reset();
// ns[kPhaseCount], counts[kPhaseCount] (nodes or graphs), and the graphs' computing nodes
void read(uint64_t *ns, uint64_t *counts, uint64_t *nodes);

// A matmul's phase by its output's name (the vocabulary projection's own), read only when on.
Phase of_mul_mat(const ggml_tensor *dst);

// Times one node's share on thread 0 (or a whole graph, with ith 0) while profiling is on.
class Scope {
public:
    Scope(Phase phase, int ith)
        : phase_(phase), start_(ith == 0 && g_on.load(std::memory_order_relaxed) ? now_ns() : 0) {}
    ~Scope() {
        if (start_ != 0) add(phase_, now_ns() - start_);
    }
    Scope(const Scope &) = delete;
    Scope &operator=(const Scope &) = delete;

private:
    Phase phase_;
    uint64_t start_;
};

}  // namespace stackd::profile
