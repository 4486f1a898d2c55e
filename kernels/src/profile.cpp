#include "profile.h"

#include <chrono>
#include <cstring>

#include "ggml.h"

namespace stackd::profile {

std::atomic<bool> g_on{false};

namespace {
std::atomic<uint64_t> g_ns[kPhaseCount];
std::atomic<uint64_t> g_counts[kPhaseCount];
std::atomic<uint64_t> g_nodes{0};
}  // namespace

uint64_t now_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
}

void add(Phase phase, uint64_t ns) {
    g_ns[phase].fetch_add(ns, std::memory_order_relaxed);
    g_counts[phase].fetch_add(1, std::memory_order_relaxed);
}

void add_nodes(uint64_t nodes) { g_nodes.fetch_add(nodes, std::memory_order_relaxed); }

void reset() {
    for (int i = 0; i < kPhaseCount; i++) {
        g_ns[i].store(0, std::memory_order_relaxed);
        g_counts[i].store(0, std::memory_order_relaxed);
    }
    g_nodes.store(0, std::memory_order_relaxed);
}

void read(uint64_t *ns, uint64_t *counts, uint64_t *nodes) {
    for (int i = 0; i < kPhaseCount; i++) {
        ns[i] = g_ns[i].load(std::memory_order_relaxed);
        counts[i] = g_counts[i].load(std::memory_order_relaxed);
    }
    *nodes = g_nodes.load(std::memory_order_relaxed);
}

Phase of_mul_mat(const ggml_tensor *dst) {
    if (!g_on.load(std::memory_order_relaxed)) return kMatmul;
    return std::strcmp(dst->name, "result_output") == 0 ? kLmHead : kMatmul;
}

}  // namespace stackd::profile
