// What libstackd_kernels.so exports: the calls server/engine/accel.py makes to plug the
// kernels into this process's ggml and set how they compute. The op self-check, the timer and the other questions the
// tests and bench/ ask live in the test-only libstackd_kernels_check.so (check.cpp).
#include <algorithm>

#include "backend.h"
#include "fusion.h"
#include "lazy_commit.h"
#include "profile.h"

namespace {
bool valid_path(int path) { return path >= 0 && path < stackd::kPathCount; }
}  // namespace

STACKD_API int stackd_kernels_cpu_supports(int path) {
    return valid_path(path) && stackd::cpu_supports((stackd::Path)path);
}

// Registers the ACCEL device into this process's ggml (once) and sets the path (-1: the best
// this CPU has). Returns the path in use, or -1 if the CPU cannot run the one asked for.
STACKD_API int stackd_kernels_register(int path) {
    if (path < 0) path = (int)stackd::best_path();
    if (!stackd_kernels_cpu_supports(path) || !stackd::cpu_backend_uses_openmp()) return -1;
    stackd::set_path((stackd::Path)path);
    static const bool registered = [] {
        ggml_backend_register(stackd::backend_reg());
        return true;
    }();
    (void)registered;
    return path;
}

// Has every ggml CPU buffer allocated from now on clear to zero by giving its whole pages back
// (lazy_commit.h): a KV cache is committed as its cells fill, not when llama.cpp clears it.
// Needs no registered device (engine.kv_commit = lazy, with or without our kernels). Once.
STACKD_API void stackd_kernels_commit_on_write() { stackd::commit_cpu_buffers_on_write(); }

// Which steps of this process's backends (each model's, each served one's) keep every row's
// arithmetic independent of its batch, from the next graph on: 0 none (ggml's own paths),
// 1 decode and verification steps (the default), 2 every step (engine.batch_invariant;
// backend.cpp, "One arithmetic per row").
STACKD_API void stackd_kernels_batch_invariant(int steps) {
    stackd::set_invariance((stackd::Invariance)std::clamp(steps, 0, 2));
}

// Whether decode attention is ours (1, the default) or ggml's (0), from the next graph on, in
// every backend of this process: bench/kernels_engine.py's A/B.
STACKD_API void stackd_kernels_attention(int on) { stackd::set_attention(on != 0); }
STACKD_API void stackd_kernels_prefill_attention(int on) { stackd::set_prefill_attention(on != 0); }
STACKD_API void stackd_kernels_chunked(int on) { stackd::set_chunked(on != 0); }
STACKD_API int stackd_kernels_runs(int64_t attn_output, int64_t ffn_down) {
    return stackd::set_runs(attn_output, ffn_down) ? 0 : -1;
}

// The device a ggml RPC server child serves (backend.cpp, "the served buffer"), computing with
// the path stackd_kernels_register set; null before a successful register.
STACKD_API void *stackd_kernels_rpc_device() {
    static const bool ok = stackd::cpu_backend_uses_openmp();
    return ok ? (void *)stackd::served_device_handle() : nullptr;
}

// How many weights of ggml type `type` the models loaded in this process hold in our buffers
// (each runs on our kernels); accel.py reports them per type in a loaded model's description.
STACKD_API int64_t stackd_kernels_tensors(int type) { return stackd::repacked_tensors((ggml_type)type); }

// Where graphs' time goes on our side (profile.h), for bench/roofline.py: on (1) clears the
// totals and starts counting, off (0) stops. Read: the ns and counts of each phase (kPhaseCount
// of each, in profile.h's order) and the graphs' nodes; returns kPhaseCount.
STACKD_API void stackd_kernels_profile(int on) {
    if (on) stackd::profile::reset();
    stackd::profile::g_on.store(on != 0, std::memory_order_relaxed);
}
STACKD_API int stackd_kernels_profile_read(uint64_t *ns, uint64_t *counts, uint64_t *nodes) {
    stackd::profile::read(ns, counts, nodes);
    return stackd::profile::kPhaseCount;
}

// Whether graphs' nodes are fused (fusion.h; on by default) from the next graph on, in every
// backend of this process: bench/roofline.py's A/B. And the nodes fused away so far.
STACKD_API void stackd_kernels_fusion(int on) { stackd::backend_detail::set_fusion(on != 0); }
STACKD_API uint64_t stackd_kernels_fused_nodes() { return stackd::backend_detail::fused_nodes(); }
