#include "repack.h"

#include "layout.h"
#include "layout_qk.h"

namespace stackd {

size_t repacked_bytes(ggml_type type, int64_t rows, int64_t k) {
    switch (type) {
        case GGML_TYPE_Q8_0: return repacked_size_q8_0(rows, k);
        case GGML_TYPE_Q4_0: return repacked_size_q4_0(rows, k);
        case GGML_TYPE_Q5_0: return repacked_size_q5_0(rows, k);
        case GGML_TYPE_Q5_1: return repacked_size_q5_1(rows, k);
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
        case GGML_TYPE_Q6_K: return repacked_size_k(type, rows, k);
        default: return repacked_size(rows, k);
    }
}

void repack_weight(ggml_type type, const void *plain, int64_t rows, int64_t k, void *out) {
    switch (type) {
        case GGML_TYPE_Q8_0: repack_q8_0(plain, rows, k, static_cast<Q8x8Block *>(out)); break;
        case GGML_TYPE_Q4_0: repack_q4_0(plain, rows, k, static_cast<Q40x8Block *>(out)); break;
        case GGML_TYPE_Q5_0: repack_q5_0(plain, rows, k, static_cast<Q50x8Block *>(out)); break;
        case GGML_TYPE_Q5_1: repack_q5_1(plain, rows, k, static_cast<Q51x8Block *>(out)); break;
        case GGML_TYPE_Q4_K: repack_q4_k(plain, rows, k, static_cast<Q4Kx8Block *>(out)); break;
        case GGML_TYPE_Q5_K: repack_q5_k(plain, rows, k, static_cast<Q5Kx8Block *>(out)); break;
        case GGML_TYPE_Q6_K: repack_q6_k(plain, rows, k, static_cast<Q6Kx8Block *>(out)); break;
        default: repack_q4_1(plain, rows, k, static_cast<Q4x8Block *>(out)); break;
    }
}

void unpack_weight(ggml_type type, const void *packed, int64_t rows, int64_t k, void *plain) {
    switch (type) {
        case GGML_TYPE_Q8_0: unpack_q8_0(static_cast<const Q8x8Block *>(packed), rows, k, plain); break;
        case GGML_TYPE_Q4_0: unpack_q4_0(static_cast<const Q40x8Block *>(packed), rows, k, plain); break;
        case GGML_TYPE_Q5_0: unpack_q5_0(static_cast<const Q50x8Block *>(packed), rows, k, plain); break;
        case GGML_TYPE_Q5_1: unpack_q5_1(static_cast<const Q51x8Block *>(packed), rows, k, plain); break;
        case GGML_TYPE_Q4_K: unpack_q4_k(static_cast<const Q4Kx8Block *>(packed), rows, k, plain); break;
        case GGML_TYPE_Q5_K: unpack_q5_k(static_cast<const Q5Kx8Block *>(packed), rows, k, plain); break;
        case GGML_TYPE_Q6_K: unpack_q6_k(static_cast<const Q6Kx8Block *>(packed), rows, k, plain); break;
        default: unpack_q4_1(static_cast<const Q4x8Block *>(packed), rows, k, plain); break;
    }
}

}  // namespace stackd
