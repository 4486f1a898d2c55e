// ggml's own block_q4_1 and block_q5_1 (from ggml-common.h, the llama.cpp source we build
// against), with accessors for their scale and minimum (nested in anonymous-union wrappers in C++ mode).
#pragma once

#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"

namespace stackd {

inline ggml_half &q4_1_d(block_q4_1 &b) { return b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.d; }
inline ggml_half &q4_1_m(block_q4_1 &b) { return b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.m; }
inline ggml_half q4_1_d(const block_q4_1 &b) { return b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.d; }
inline ggml_half q4_1_m(const block_q4_1 &b) { return b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.m; }
inline ggml_half &q5_1_d(block_q5_1 &b) { return b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.d; }
inline ggml_half &q5_1_m(block_q5_1 &b) { return b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.m; }
inline ggml_half q5_1_d(const block_q5_1 &b) { return b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.d; }
inline ggml_half q5_1_m(const block_q5_1 &b) { return b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.m; }

}  // namespace stackd
