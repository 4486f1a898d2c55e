#include "layout_qk.h"

#include <cmath>
#include <cstring>

#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"
#include "ggml.h"

namespace stackd {

namespace {

static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210,
              "K-quant blocks as ggml defines them");

// One row's super-block with every value unpacked: what both layouts encode.
struct Values {
    uint16_t d, dmin;
    uint8_t sc[16];   // Q4_K: 8 scales; Q6_K: 16 (int8 as bytes)
    uint8_t mn[8];    // Q4_K only
    uint8_t q[kQK_K]; // Q4_K 0..15, Q5_K 0..31, Q6_K 0..63
};

// ggml's 12-byte packing of eight 6-bit scales and eight 6-bit minimums (get_scale_min_k4),
// both ways: every one of the 96 bits is a value's, so the encoding is its inverse.
void decode_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

void encode_scales(const uint8_t *sc, const uint8_t *mn, uint8_t *s) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
    }
}

// ggml's Q4_K, and Q5_K's same fields: byte l of chunk j (32 bytes) holds weight 64j + l low,
// 64j + 32 + l high (Q5_K: their low four bits).
template <class Block>
Values decode_q4k(const Block &b) {
    Values v{};
    std::memcpy(&v.d, &b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.d, 2);
    std::memcpy(&v.dmin, &b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.dmin, 2);
    decode_scales(b.scales, v.sc, v.mn);
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            v.q[64 * j + l] = b.qs[32 * j + l] & 0xF;
            v.q[64 * j + 32 + l] = b.qs[32 * j + l] >> 4;
        }
    return v;
}

template <class Block>
void encode_q4k(const Values &v, Block &b) {
    std::memcpy(&b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.d, &v.d, 2);
    std::memcpy(&b.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.dmin, &v.dmin, 2);
    encode_scales(v.sc, v.mn, b.scales);
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++)
            b.qs[32 * j + l] = (uint8_t)((v.q[64 * j + l] & 0xF) | (v.q[64 * j + 32 + l] & 0xF) << 4);
}

Values decode(const block_q4_K &b) { return decode_q4k(b); }
void encode(const Values &v, block_q4_K &b) { encode_q4k(v, b); }

// ggml's Q5_K (dequantize_row_q5_K): Q4_K's fields, and bit 2j (2j + 1) of qh[l] the fifth
// bit of weight 64j + l (64j + 32 + l).
Values decode(const block_q5_K &b) {
    Values v = decode_q4k(b);
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            v.q[64 * j + l] |= (uint8_t)(((b.qh[l] >> (2 * j)) & 1) << 4);
            v.q[64 * j + 32 + l] |= (uint8_t)(((b.qh[l] >> (2 * j + 1)) & 1) << 4);
        }
    return v;
}

void encode(const Values &v, block_q5_K &b) {
    encode_q4k(v, b);
    std::memset(b.qh, 0, sizeof b.qh);
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++)
            b.qh[l] |= (uint8_t)((v.q[64 * j + l] >> 4) << (2 * j) | (v.q[64 * j + 32 + l] >> 4) << (2 * j + 1));
}

// ggml's Q6_K (dequantize_row_q6_K): per 128-weight half n, for l = 0..31, weights l, l+32,
// l+64, l+96 take ql[l] low, ql[l+32] low, ql[l] high, ql[l+32] high, and qh[l]'s bit pairs.
Values decode(const block_q6_K &b) {
    Values v{};
    std::memcpy(&v.d, &b.d, 2);
    std::memcpy(v.sc, b.scales, 16);
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b.ql + 64 * n, *qh = b.qh + 32 * n;
        uint8_t *q = v.q + 128 * n;
        for (int l = 0; l < 32; l++) {
            q[l] = (ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4;
            q[l + 32] = (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4;
            q[l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
            q[l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
        }
    }
    return v;
}

void encode(const Values &v, block_q6_K &b) {
    std::memcpy(&b.d, &v.d, 2);
    std::memcpy(b.scales, v.sc, 16);
    for (int n = 0; n < 2; n++) {
        uint8_t *ql = b.ql + 64 * n, *qh = b.qh + 32 * n;
        const uint8_t *q = v.q + 128 * n;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((q[l] & 0xF) | (q[l + 64] & 0xF) << 4);
            ql[l + 32] = (uint8_t)((q[l + 32] & 0xF) | (q[l + 96] & 0xF) << 4);
            qh[l] = (uint8_t)((q[l] >> 4) | (q[l + 32] >> 4) << 2 | (q[l + 64] >> 4) << 4 | (q[l + 96] >> 4) << 6);
        }
    }
}

// The nibble interleave both layouts share (layout_qk.h): low four bits of row r's values.
uint8_t &nibble_byte(uint8_t *qs, int r, int j, int c, int i) { return qs[256 * j + 32 * c + 4 * r + i]; }

// Q4_K's part of a Q4_K or Q5_K block: scales, minimums, and the low four bits of the values.
template <class Block>
void to_lane_q4k(const Values &v, int r, Block &dst) {
    dst.d[r] = v.d;
    dst.dmin[r] = v.dmin;
    for (int k = 0; k < 4; k++) {
        dst.sc_lo[k][r] = (uint8_t)((v.sc[k] & 15) | (v.sc[k + 4] & 15) << 4);
        dst.mn_lo[k][r] = (uint8_t)((v.mn[k] & 15) | (v.mn[k + 4] & 15) << 4);
        dst.hi[k][r] = (uint8_t)(v.sc[k] >> 4 | (v.sc[k + 4] >> 4) << 2 | (v.mn[k] >> 4) << 4 | (v.mn[k + 4] >> 4) << 6);
    }
    for (int j = 0; j < 4; j++)
        for (int c = 0; c < 8; c++)
            for (int i = 0; i < 4; i++)
                nibble_byte(dst.qs, r, j, c, i) =
                    (uint8_t)((v.q[64 * j + 4 * c + i] & 0xF) | (v.q[64 * j + 32 + 4 * c + i] & 0xF) << 4);
}

template <class Block>
Values from_lane_q4k(const Block &src, int r) {
    Values v{};
    v.d = src.d[r];
    v.dmin = src.dmin[r];
    for (int s = 0; s < 8; s++) {
        v.sc[s] = (uint8_t)q4k_scale(src, r, s);
        v.mn[s] = (uint8_t)q4k_min(src, r, s);
    }
    for (int j = 0; j < 4; j++)
        for (int c = 0; c < 8; c++)
            for (int i = 0; i < 4; i++) {
                const uint8_t byte = src.qs[256 * j + 32 * c + 4 * r + i];
                v.q[64 * j + 4 * c + i] = byte & 0xF;
                v.q[64 * j + 32 + 4 * c + i] = byte >> 4;
            }
    return v;
}

void to_lane(const Values &v, int r, Q4Kx8Block &dst) { to_lane_q4k(v, r, dst); }
Values from_lane(const Q4Kx8Block &src, int r) { return from_lane_q4k(src, r); }

void to_lane(const Values &v, int r, Q5Kx8Block &dst) {
    to_lane_q4k(v, r, dst);
    for (int c = 0; c < 8; c++)
        for (int i = 0; i < 4; i++) {
            uint8_t bits = 0;
            for (int s = 0; s < 8; s++) bits |= (uint8_t)((v.q[32 * s + 4 * c + i] >> 4) << s);
            dst.qh[32 * c + 4 * r + i] = bits;
        }
}

Values from_lane(const Q5Kx8Block &src, int r) {
    Values v = from_lane_q4k(src, r);
    for (int p = 0; p < kQK_K; p++) v.q[p] = (uint8_t)(v.q[p] | q5k_high_bit(src, r, p) << 4);
    return v;
}

void to_lane(const Values &v, int r, Q6Kx8Block &dst) {
    dst.d[r] = v.d;
    for (int s = 0; s < 16; s++) dst.sc[s][r] = (int8_t)v.sc[s];
    for (int j = 0; j < 4; j++) {
        for (int c = 0; c < 8; c++)
            for (int i = 0; i < 4; i++)
                nibble_byte(dst.ql, r, j, c, i) =
                    (uint8_t)((v.q[64 * j + 4 * c + i] & 0xF) | (v.q[64 * j + 32 + 4 * c + i] & 0xF) << 4);
        for (int h = 0; h < 4; h++)
            for (int i = 0; i < 4; i++) {
                uint8_t byte = 0;
                for (int s = 0; s < 4; s++) byte |= (uint8_t)((v.q[64 * j + 4 * (h + 4 * s) + i] >> 4) << (2 * s));
                dst.qh[128 * j + 32 * h + 4 * r + i] = byte;
            }
    }
}

Values from_lane(const Q6Kx8Block &src, int r) {
    Values v{};
    v.d = src.d[r];
    for (int s = 0; s < 16; s++) v.sc[s] = (uint8_t)src.sc[s][r];
    for (int j = 0; j < 4; j++)
        for (int quad = 0; quad < 16; quad++)
            for (int i = 0; i < 4; i++) {
                const int p = 4 * quad + i;   // position in the chunk
                const uint8_t lo = src.ql[256 * j + 32 * (p % 32 / 4) + 4 * r + i] >> (p >= 32 ? 4 : 0) & 0xF;
                const uint8_t hi = src.qh[128 * j + 32 * (quad % 4) + 4 * r + i] >> (2 * (quad / 4)) & 3;
                v.q[64 * j + p] = (uint8_t)(lo | hi << 4);
            }
    return v;
}

template <class Plain, class Packed>
void repack_rows(const void *plain, int64_t rows, int64_t k, Packed *out) {
    const int64_t nb = k / kQK_K, groups = row_groups(rows);
    const Plain *src = static_cast<const Plain *>(plain);
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++) {
            Packed &dst = out[g * nb + b];
            std::memset(&dst, 0, sizeof dst);   // padding rows: d = 0
            for (int r = 0; r < kRowsPerGroup && g * kRowsPerGroup + r < rows; r++)
                to_lane(decode(src[(g * kRowsPerGroup + r) * nb + b]), r, dst);
        }
}

template <class Plain, class Packed>
void unpack_rows(const Packed *in, int64_t rows, int64_t k, void *plain) {
    const int64_t nb = k / kQK_K;
    Plain *dst = static_cast<Plain *>(plain);
    for (int64_t row = 0; row < rows; row++)
        for (int64_t b = 0; b < nb; b++)
            encode(from_lane(in[row / kRowsPerGroup * nb + b], (int)(row % kRowsPerGroup)), dst[row * nb + b]);
}

// ggml's nearest_int: round half to even through the float adder (valid for |x| <= 2^22).
int nearest_int(float x) {
    float v = x + 12582912.f;
    int i;
    std::memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

}  // namespace

void repack_q4_k(const void *plain, int64_t rows, int64_t k, Q4Kx8Block *out) { repack_rows<block_q4_K>(plain, rows, k, out); }
void unpack_q4_k(const Q4Kx8Block *in, int64_t rows, int64_t k, void *plain) { unpack_rows<block_q4_K>(in, rows, k, plain); }
void repack_q5_k(const void *plain, int64_t rows, int64_t k, Q5Kx8Block *out) { repack_rows<block_q5_K>(plain, rows, k, out); }
void unpack_q5_k(const Q5Kx8Block *in, int64_t rows, int64_t k, void *plain) { unpack_rows<block_q5_K>(in, rows, k, plain); }
void repack_q6_k(const void *plain, int64_t rows, int64_t k, Q6Kx8Block *out) { repack_rows<block_q6_K>(plain, rows, k, out); }
void unpack_q6_k(const Q6Kx8Block *in, int64_t rows, int64_t k, void *plain) { unpack_rows<block_q6_K>(in, rows, k, plain); }

void unpack_row_k(int type, const void *packed, int64_t k, int64_t row, void *plain) {
    const int64_t nb = k / kQK_K, first = row / kRowsPerGroup * nb;
    const int r = (int)(row % kRowsPerGroup);
    for (int64_t b = 0; b < nb; b++) {
        if (type == GGML_TYPE_Q4_K)
            encode(from_lane(static_cast<const Q4Kx8Block *>(packed)[first + b], r), static_cast<block_q4_K *>(plain)[b]);
        else if (type == GGML_TYPE_Q5_K)
            encode(from_lane(static_cast<const Q5Kx8Block *>(packed)[first + b], r), static_cast<block_q5_K *>(plain)[b]);
        else
            encode(from_lane(static_cast<const Q6Kx8Block *>(packed)[first + b], r), static_cast<block_q6_K *>(plain)[b]);
    }
}

bool is_k_quant(int type) { return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K; }

size_t repacked_size_k(int type, int64_t rows, int64_t k) {
    const size_t block = type == GGML_TYPE_Q4_K   ? sizeof(Q4Kx8Block)
                         : type == GGML_TYPE_Q5_K ? sizeof(Q5Kx8Block)
                                                  : sizeof(Q6Kx8Block);
    return (size_t)row_groups(rows) * (size_t)(k / kQK_K) * block;
}

// Mirrors ggml's quantize_row_q8_K_ref operation for operation (the x86 build calls it): the
// signed value of largest magnitude sets iscale = -127/max, q = min(127, nearest_int(iscale x)),
// d = 1/iscale. Our 16- and 32-position sums are exact integers. The reference for
// quantize_row_k's SIMD path (quantize.cpp), which must give the same bytes.
void quantize_row_k_scalar(const float *x, int64_t k, ActKBlock *out) {
    for (int64_t b = 0; b < k / kQK_K; b++, x += kQK_K) {
        ActKBlock &y = out[b];
        float max = 0, amax = 0;
        for (int j = 0; j < kQK_K; j++) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0) {
            std::memset(&y, 0, sizeof y);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < kQK_K; j++) {
            const int v = nearest_int(iscale * x[j]);
            y.q[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += y.q[16 * j + i];
            y.bsum16[j] = (int16_t)sum;
        }
        for (int j = 0; j < 8; j++) y.bsum32[j] = (int16_t)(y.bsum16[2 * j] + y.bsum16[2 * j + 1]);
        y.d = 1 / iscale;
    }
}

}  // namespace stackd
