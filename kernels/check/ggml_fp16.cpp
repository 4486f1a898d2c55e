// ggml's two fp16 conversions, for the path check (paths_check.cpp), which links no ggml
// library: defined from ggml's own header (ggml-impl.h's GGML_FP16_TO_FP32 / GGML_FP32_TO_FP16,
// what libggml-base's ggml_fp16_to_fp32 and ggml_fp32_to_fp16 return), so the scalar path it
// holds the SIMD paths to converts exactly as in the product.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "ggml-impl.h"
#pragma GCC diagnostic pop

float ggml_fp16_to_fp32(ggml_fp16_t x) { return GGML_FP16_TO_FP32(x); }
ggml_fp16_t ggml_fp32_to_fp16(float x) { return GGML_FP32_TO_FP16(x); }
