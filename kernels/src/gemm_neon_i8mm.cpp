// The aarch64 int8-matrix-multiply path of the 32-weight formats (gemm_neon_body.h): smmla for
// tiles of two tokens or more, sdot for a lone token. Compiled for ARMv8.2-A with the dot
// products and FEAT_I8MM by the target pragma; chosen at run time where HWCAP2_I8MM is set
// (cpu_features.cpp). The same bits as the dot-product and scalar paths.
#include <arm_neon.h>

#include "kernels.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")
#define STACKD_NEON_I8MM 1   // the body's smmla half (gemm_neon_body.h)
#include "gemm_neon_body.h"

namespace stackd {

Kernels neon_i8mm_kernels() { return neon::kernels<true>(); }

}  // namespace stackd

#pragma GCC pop_options
