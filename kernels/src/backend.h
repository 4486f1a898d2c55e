// The ggml side: a backend registry with one ACCEL device, its repacking buffer type and
// its backend (whole graphs on ggml's CPU backend, our MUL_MATs inside). See README.md for
// how llama.cpp picks them up.
#pragma once

#include <cstdint>

#include "ggml-backend.h"
#include "cpu_features.h"

namespace stackd {

ggml_backend_reg_t backend_reg();
ggml_backend_buffer_type_t repack_buffer_type();
// A backend computing with the given path (the registered device's backends use the current
// process-wide path; tests and benchmarks create one per path).
ggml_backend_t backend_new(Path path);
// The device a ggml RPC server serves (never registered): every tensor in its served buffer
// type, weights repacked when written whole, our MUL_MAT/GET_ROWS on them and ggml's CPU
// backend for the rest (backend.cpp, "the served buffer"). Its backends follow the current path.
ggml_backend_dev_t served_device_handle();
ggml_backend_t served_backend_new();
void set_path(Path path);
// Whether the process's ggml CPU backend runs graphs on an OpenMP team (ours need it).
bool cpu_backend_uses_openmp();
Path current_path();
// Which steps run ggml's CPU ops on one arithmetic per row, however many rows they have
// (ggml's use_ref: backend.cpp, "One arithmetic per row"), from the next graph on.
enum class Invariance { kNone = 0, kDecodeSteps = 1, kAllSteps = 2 };
void set_invariance(Invariance invariance);
// Whether FLASH_ATTN_EXT nodes on one-row-at-a-time steps run on our decode attention (attention.h)
// or on ggml's, from the next graph on (on by default; a benchmark's A/B turns it off).
void set_attention(bool on);
// Whether the prompts' steps' FLASH_ATTN_EXT nodes run on ours too (on by default; off: ggml's
// tiled attention, a benchmark's A/B).
void set_prefill_attention(bool on);
// Whether the products a tensor split cuts take the chunked form (on unless a benchmark's A/B
// turns it off: bench/kernels_engine.py --chunked off; a split's answers are then no longer
// one node's).
void set_chunked(bool on);
// The chunked form's runs, in weights, instead of those each weight's K gives (backend.cpp):
// a tensor split's shard sets the whole weights' (its K is a slice). attn_output's a multiple
// of 32, ffn_down's of 256, each up to 65,536; both 0: each weight's own again. False
// otherwise (both unchanged).
bool set_runs(int64_t attn_output, int64_t ffn_down);
// A whole weight's run of K weights: attn_output's (attn_output true) or ffn_down's (backend.cpp
// states the rule; server/engine/accel.py repeats it for the shard planner, and a test holds
// the two to each other through the check library).
int64_t chunk_run_for(bool attn_output, int64_t k);
// FLASH_ATTN_EXT nodes this copy of the library has computed on our decode attention.
uint64_t attention_nodes();
// Weights of `type` in the registered device's live buffers (repacked, so on our kernels).
int64_t repacked_tensors(ggml_type type);

// What the registry's get_proc_address gives for this name: a uint64_t (*)() counting the
// GET_ROWS nodes the registered device's backends have computed in this process (tables of
// ours; a test asks it through ggml's registry, the library exports nothing for it).
constexpr const char *kGetRowsNodesProc = "stackd_get_rows_nodes";
using GetRowsNodesFn = uint64_t (*)();

}  // namespace stackd

#define STACKD_API extern "C" __attribute__((visibility("default")))
