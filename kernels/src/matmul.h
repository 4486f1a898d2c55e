// MUL_MAT on weights in our repacked buffer: quantize the activations once, then run the
// chosen path's kernel over row groups on the engine's threads.
#pragma once

#include <vector>

#include "ggml.h"
#include "kernels.h"

namespace stackd {

// Whether we can compute this MUL_MAT node given its weight is repacked (shape and types).
bool can_serve(const ggml_tensor *op);

// Computes the MUL_MAT nodes in order, dst = mul_mat(src[0] (repacked Q4_1), src[1]), in one
// parallel region of n_threads threads: one fork and join per scheduler split rather than per
// node. Consecutive nodes reading the same activations (q, k, v; gate, up) quantize them once.
// scratch holds the quantized activations (grown as needed).
void mul_mat_nodes(ggml_tensor *const *nodes, int n_nodes, Path path, int n_threads,
                   std::vector<ActBlock> &scratch);

}  // namespace stackd
