// Fewer nodes in a graph of ours: ggml's CPU backend meets its threads at a barrier after every
// node that computes, and a decode step of SmolLM2 has ~19 of them a layer (bench/roofline.py
// prints the count), each a few microseconds on two cores whatever its size. Two rewrites,
// each computing exactly the numbers of the nodes it replaces (greedy answers byte-equal with
// fusion on and off, every row's logprobs the same: tests/kernels/test_fusion.py):
//
// - A residual add, the RMS norm of its sum and the norm's weight (ADD, RMS_NORM, MUL), or a
//   norm and its weight alone, become one node of ours: per row the sum, its square sum in
//   double in element order, the scale 1/sqrt(mean + eps) in float and the two products, as
//   ggml's per-row code computes them. The norm's own output, read by nothing else, is skipped.
// - Products of ours that read the same activations (a layer's q, k and v; its gate and up)
//   become one node: the activations quantized once, then each product's rows, no barrier
//   between. The later ones are computed before the nodes between them (q's rope), so a
//   product joins only when its output shares no memory with anything those nodes read or
//   write, nor with the inputs: ggml's allocator may give a later node memory an earlier one
//   has finished with, and then it stays where it is.
//
// Fused-away nodes become GGML_OP_NONE for the graph's computation (ggml skips them, with no
// barrier) and are put back after, like every node of ours (backend.cpp, swap_in_tasks).
// Never in a tensor-parallel graph: its residual adds are exchanges (tp_backend.cpp).
#pragma once

#include <cstdint>

#include "backend_context.h"

namespace stackd::backend_detail {

// Rewrites the graph's nodes (after swap_in_tasks turned ours into custom ops); every node it
// changes is recorded in ctx->swapped to be put back.
void fuse_graph(BackendContext *ctx, ggml_cgraph *graph);

// Whether a node is one of our plain products (the custom op swap_in_tasks made of a MUL_MAT
// on a weight of ours, not a chunked or tensor-parallel one): backend.cpp.
bool is_plain_product(const ggml_tensor *node);

// Whether fusion runs (on unless a benchmark's A/B turns it off), and the nodes it fused away
// in this process so far (a test's question).
void set_fusion(bool on);
uint64_t fused_nodes();

}  // namespace stackd::backend_detail
