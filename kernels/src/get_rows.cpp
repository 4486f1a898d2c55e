#include "get_rows.h"

#include <vector>

#include "layout_qk.h"
#include "matmul.h"

namespace stackd {

bool can_serve_get_rows(const ggml_tensor *op) {
    const ggml_tensor *w = op->src[0], *ids = op->src[1];
    const bool table_type = is_repacked_type(w->type);
    return op->op == GGML_OP_GET_ROWS && table_type && w->view_src == nullptr &&
           w->ne[2] == 1 && w->ne[3] == 1 && w->ne[0] % block_length(w->type) == 0 && ggml_is_contiguous(w) &&
           ids->type == GGML_TYPE_I32 && ids->ne[1] == 1 && ids->ne[2] == 1 && ids->ne[3] == 1 &&
           op->type == GGML_TYPE_F32 && op->nb[0] == sizeof(float);
}

void dequantize_row_q8x8(const Q8x8Block *w, int64_t k, int64_t row, float *out) {
    const int64_t nb = k / kQK;
    const Q8x8Block *group = w + (row / kRowsPerGroup) * nb;
    const int r = (int)(row % kRowsPerGroup);
    for (int64_t b = 0; b < nb; b++) {
        const float d = ggml_fp16_to_fp32(group[b].d[r]);
        for (int p = 0; p < kQK; p++) {
            const int8_t q = (int8_t)(group[b].qs[32 * (p / 4) + 4 * r + p % 4] ^ 0x80);  // layout.h
            out[b * kQK + p] = q * d;
        }
    }
}

namespace {

// A row of the other types: ggml's blocks again, then ggml's own dequantization.
void dequantize_row_plain(const ggml_tensor *w, int64_t row, float *out) {
    thread_local std::vector<uint8_t> plain;
    plain.resize(ggml_row_size(w->type, w->ne[0]));
    if (is_k_quant(w->type)) unpack_row_k(w->type, w->data, w->ne[0], row, plain.data());
    else unpack_row_32(w->type, w->data, w->ne[0], row, plain.data());
    ggml_get_type_traits(w->type)->to_float(plain.data(), out, w->ne[0]);
}

}  // namespace

void get_rows_share(ggml_tensor *dst, int ith, int nth) {
    const ggml_tensor *w = dst->src[0], *ids = dst->src[1];
    int64_t begin, end;
    share(ids->ne[0], ith, nth, &begin, &end);
    for (int64_t i = begin; i < end; i++) {
        const int32_t row = *reinterpret_cast<const int32_t *>(static_cast<const char *>(ids->data) + i * ids->nb[0]);
        GGML_ASSERT(row >= 0 && row < w->ne[1]);  // as ggml's own get_rows
        float *out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + i * dst->nb[1]);
        if (w->type == GGML_TYPE_Q8_0) dequantize_row_q8x8(static_cast<const Q8x8Block *>(w->data), w->ne[0], row, out);
        else dequantize_row_plain(w, row, out);
    }
}

}  // namespace stackd
