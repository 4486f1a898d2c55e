#include <cmath>
#include <cstring>

#include "cpu_features.h"
#include "ggml.h"
#include "kernels.h"
#include "layout_qk.h"
#include "quantize_x86.h"

namespace stackd {

namespace {

// Mirrors ggml-cpu's x86 quantize_row_q8_1 operation for operation (d = amax/127 and
// id = 127/amax computed separately, round half to even, d and d*sum stored as fp16), so
// that our integer block sums and scales are exactly the ones ggml's own Q4_1 path uses.
void quantize_row_scalar(const float *x, int64_t k, ActBlock *out) {
    for (int64_t b = 0; b < k / kQK; b++, x += kQK) {
        float amax = 0.0f;
        for (int i = 0; i < kQK; i++) amax = std::fmax(amax, std::fabs(x[i]));
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < kQK; i++) {
            const int q = (int)std::nearbyint(x[i] * id);
            out[b].q[i] = (int8_t)q;
            sum += q;
        }
        out[b].d = ggml_fp16_to_fp32(ggml_fp32_to_fp16(d));
        out[b].s = ggml_fp16_to_fp32(ggml_fp32_to_fp16(d * (float)sum));
    }
}

using QuantizeRow = void (*)(const float *, int64_t, ActBlock *);

QuantizeRow chosen_quantize_row() {
#if defined(__x86_64__) || defined(__i386__)
    if (cpu_supports(Path::Avx2)) return quantize_row_avx2;
#endif
    return quantize_row_scalar;
}

using QuantizeRowK = void (*)(const float *, int64_t, ActKBlock *);

QuantizeRowK chosen_quantize_row_k() {
#if defined(__x86_64__) || defined(__i386__)
    if (cpu_supports(Path::Avx2)) return quantize_row_k_avx2;
#endif
    return quantize_row_k_scalar;
}

}  // namespace

void quantize_row(const float *x, int64_t k, ActBlock *out) {
    static const QuantizeRow quantize = chosen_quantize_row();
    quantize(x, k, out);
}

void quantize_row_k(const float *x, int64_t k, ActKBlock *out) {
    static const QuantizeRowK quantize = chosen_quantize_row_k();
    quantize(x, k, out);
}

}  // namespace stackd
