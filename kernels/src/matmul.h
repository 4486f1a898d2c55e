// MUL_MAT on a weight in our repacked buffer: quantize the activations once, then run the
// chosen path's kernel over row groups on the engine's threads.
#pragma once

#include <vector>

#include "ggml.h"
#include "kernels.h"

namespace stackd {

// Whether we can compute this MUL_MAT node given its weight is repacked (shape and types).
bool can_serve(const ggml_tensor *op);

// Computes dst = mul_mat(dst->src[0] (repacked Q4_1), dst->src[1]) on n_threads threads.
// scratch holds the quantized activations between calls (grown as needed).
void mul_mat(ggml_tensor *dst, Path path, int n_threads, std::vector<ActBlock> &scratch);

}  // namespace stackd
