// The repacked K-quant layouts (Q4_K, Q5_K, Q6_K) and the Q8_K activations their kernels read.
//
// A K-quant super-block holds 256 weights of one row with one fp16 scale d (Q4_K: and one
// fp16 dmin) and small integer scales per sub-block (Q4_K: eight sub-blocks of 32, a 6-bit
// scale and a 6-bit minimum each, w = d*sc*q - dmin*m, q in 0..15; Q6_K: sixteen of 16, an
// int8 scale each, w = d*sc*(q - 32), q in 0..63). As for Q4_1 (layout.h), rows go eight at a
// time and one block holds the eight rows' super-block side by side, the weights interleaved
// for 4-wide integer dot products (one int32 lane per row):
//
//   Q4_K  qs[256*j + 32*c + 4*r + i] = q(r, 64j + 4c + i) | q(r, 64j + 32 + 4c + i) << 4
//         (j = 0..3 the 64-weight chunk, c = 0..7): masking gives sub-block 2j, shifting 2j+1.
//   Q6_K  the low four bits as Q4_K's nibbles (ql), and the top two bits of four quads per byte:
//         qh[128*j + 32*h + 4*r + i] = sum over s of hi2(q(r, 64j + 4(h + 4s) + i)) << 2s
//         (h = 0..3, s = 0..3): shifting one vector by 2s gives quad h + 4s of the chunk.
//
// The small scales are stored [sub-block][row], eight rows' side by side, so a path widens
// a sub-block's eight into its lanes at once. Both blocks take exactly ggml's bytes (a
// served buffer repacks in place); nothing is lost: the unpack gives ggml's bytes back.
#pragma once

#include <cstddef>
#include <cstdint>

#include "layout.h"

namespace stackd {

constexpr int kQK_K = 256;       // weights per K-quant super-block (ggml's QK_K)

// Q4_K's sixteen 6-bit values per row (eight scales sc_s, eight minimums m_s) take 12 bytes,
// as in ggml, so a served buffer repacks in place (backend.cpp): [k][row] bytes, k = 0..3,
//   sc_lo  = sc_k & 15 | (sc_{k+4} & 15) << 4,   mn_lo the same of the minimums,
//   hi     = sc_k >> 4 | (sc_{k+4} >> 4) << 2 | (m_k >> 4) << 4 | (m_{k+4} >> 4) << 6,
// eight rows' bytes side by side: a path widens a sub-block's eight with a few byte shifts.
struct Q4Kx8Block {
    uint16_t d[kRowsPerGroup];      // fp16 super-block scales of the eight rows
    uint16_t dmin[kRowsPerGroup];   // fp16 scales of the minimums
    uint8_t sc_lo[4][kRowsPerGroup];
    uint8_t mn_lo[4][kRowsPerGroup];
    uint8_t hi[4][kRowsPerGroup];
    uint8_t qs[kRowsPerGroup * kQK_K / 2];
};
static_assert(sizeof(Q4Kx8Block) == 1152, "Q4Kx8Block packs like eight block_q4_K");

// Q5_K (w = d*sc*q - dmin*m, q in 0..31): Q4_K's block, its nibbles the low four bits, and a
// plane of fifth bits laid out for Q4_K's chunks: bit s of qh[32*c + 4*r + i] is row r's fifth
// bit at position 32*s + 4*c + i, so sub-block s's bits for chunk c are a mask and a shift of
// one 32-byte vector away (1408 bytes, eight block_q5_K).
struct Q5Kx8Block {
    uint16_t d[kRowsPerGroup];
    uint16_t dmin[kRowsPerGroup];
    uint8_t sc_lo[4][kRowsPerGroup];
    uint8_t mn_lo[4][kRowsPerGroup];
    uint8_t hi[4][kRowsPerGroup];
    uint8_t qs[kRowsPerGroup * kQK_K / 2];
    uint8_t qh[kRowsPerGroup * kQK_K / 8];
};
static_assert(sizeof(Q5Kx8Block) == 1408, "Q5Kx8Block packs like eight block_q5_K");

// Row r's scale and minimum of sub-block s (0..7), of a Q4_K or Q5_K block.
template <class Block>
inline int q4k_scale(const Block &w, int r, int s) {
    return ((w.sc_lo[s % 4][r] >> (4 * (s / 4))) & 15) | ((w.hi[s % 4][r] >> (2 * (s / 4))) & 3) << 4;
}
template <class Block>
inline int q4k_min(const Block &w, int r, int s) {
    return ((w.mn_lo[s % 4][r] >> (4 * (s / 4))) & 15) | ((w.hi[s % 4][r] >> (4 + 2 * (s / 4))) & 3) << 4;
}

// Row r's fifth bit at position p (0..255) of a Q5_K block.
inline int q5k_high_bit(const Q5Kx8Block &w, int r, int p) {
    return (w.qh[32 * (p % 32 / 4) + 4 * r + p % 4] >> (p / 32)) & 1;
}

struct Q6Kx8Block {
    uint16_t d[kRowsPerGroup];      // fp16 super-block scales
    int8_t sc[16][kRowsPerGroup];   // int8 sub-block scales, [sub-block][row]
    uint8_t ql[kRowsPerGroup * kQK_K / 2];
    uint8_t qh[kRowsPerGroup * kQK_K / 4];
};
static_assert(sizeof(Q6Kx8Block) == 1680, "Q6Kx8Block packs like eight block_q6_K");

// One token's super-block of activations, quantized exactly as ggml's quantize_row_q8_K
// (what ggml's K-quant dot products multiply): a float scale, no fp16 rounding.
struct ActKBlock {
    float d;
    int16_t bsum16[16];   // sums of q over each 16 positions (Q6_K's sub-blocks)
    int16_t bsum32[8];    // sums over each 32 (Q4_K's sub-blocks)
    int8_t q[kQK_K];
};
static_assert(sizeof(ActKBlock) == 308, "ActKBlock is 308 bytes");

// Activation bytes 4*chunk .. 4*chunk+3 of a super-block as one int32, to broadcast.
inline int32_t quad(const ActKBlock &a, int chunk) {
    int32_t v;
    __builtin_memcpy(&v, a.q + 4 * chunk, sizeof v);
    return v;
}

// One row of k floats (k a multiple of 256) -> k/256 ActKBlocks, as ggml's quantize_row_q8_K.
void quantize_row_k(const float *x, int64_t k, ActKBlock *out);
// The same one value at a time: the reference the SIMD path is held to, byte for byte.
void quantize_row_k_scalar(const float *x, int64_t k, ActKBlock *out);

// Whether a type is a K-quant we repack, and the repacked bytes of a rows x k matrix of it.
bool is_k_quant(int ggml_type_id);
size_t repacked_size_k(int ggml_type_id, int64_t rows, int64_t k);

// Plain ggml rows (block_q4_K / block_q5_K / block_q6_K, row-major) <-> the repacked layout.
void repack_q4_k(const void *plain, int64_t rows, int64_t k, Q4Kx8Block *out);
void unpack_q4_k(const Q4Kx8Block *in, int64_t rows, int64_t k, void *plain);
void repack_q5_k(const void *plain, int64_t rows, int64_t k, Q5Kx8Block *out);
void unpack_q5_k(const Q5Kx8Block *in, int64_t rows, int64_t k, void *plain);
void repack_q6_k(const void *plain, int64_t rows, int64_t k, Q6Kx8Block *out);
void unpack_q6_k(const Q6Kx8Block *in, int64_t rows, int64_t k, void *plain);

// Row `row` of a repacked rows x k K-quant matrix as ggml's blocks (k / 256 of them).
void unpack_row_k(int ggml_type_id, const void *packed, int64_t k, int64_t row, void *plain);

}  // namespace stackd
