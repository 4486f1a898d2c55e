// The activation quantizers' x86 bodies (quantize_x86.cpp), byte for byte the scalar ones
// (quantize.cpp, layout_qk.cpp), chosen by CPUID (quantize.cpp). Only an x86 build defines them.
#pragma once

#include <cstdint>

#include "layout.h"
#include "layout_qk.h"

namespace stackd {

void quantize_row_avx2(const float *x, int64_t k, ActBlock *out);
void quantize_row_k_avx2(const float *x, int64_t k, ActKBlock *out);

}  // namespace stackd
