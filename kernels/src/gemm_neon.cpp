// The aarch64 dot-product path of the 32-weight formats (gemm_neon_body.h), compiled for
// ARMv8.2-A with FEAT_DotProd by the target pragma, not by a build flag: the library still
// loads on any ARMv8-A, and cpu_features.cpp decides at run time (HWCAP_ASIMDDP) whether this
// code may run.
#include <arm_neon.h>

#include "kernels.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#include "gemm_neon_body.h"

namespace stackd {

Kernels neon_kernels() { return neon::kernels<false>(); }

}  // namespace stackd

#pragma GCC pop_options
