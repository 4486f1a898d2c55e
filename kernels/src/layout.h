// The repacked weight layouts (Q4_1, Q8_0) and the quantized activation layout the kernels read.
//
// Weights (Q4_1, 32 weights per block: w = d*q + m, q in 0..15): rows are taken eight at a
// time ("row groups"); for each group and each K-block, one Q4x8Block holds the eight rows'
// scales, mins and nibbles side by side. The nibbles are ordered for 4-wide integer dot
// products: with U(r, k) the 4-bit value of row r at position k of the block, byte
// qs[32*j + 4*r + i] = U(r, 4*j + i) | U(r, 4*(j+4) + i) << 4   (j = 0..3, i = 0..3).
// Masking one 32-byte vector gives, for all eight rows, four consecutive positions per row
// (one int32 lane per row); shifting gives the four positions 16 further on. A row count
// that is not a multiple of eight is padded with zero rows (d = m = 0).
#pragma once

#include <cstddef>
#include <cstdint>

namespace stackd {

constexpr int kQK = 32;         // weights per Q4_1 block (ggml's QK4_1)
constexpr int kRowsPerGroup = 8;

struct Q4x8Block {
    uint16_t d[kRowsPerGroup];  // fp16 scales of the eight rows
    uint16_t m[kRowsPerGroup];  // fp16 minimums
    uint8_t qs[kRowsPerGroup * kQK / 2];
};
static_assert(sizeof(Q4x8Block) == 160, "Q4x8Block packs like eight block_q4_1");

// One token's K-block of activations, quantized exactly as ggml's quantize_row_q8_1 does
// (d and s rounded through fp16), so each integer block dot product equals ggml's.
struct ActBlock {
    float d;         // scale
    float s;         // d * sum(q)
    int8_t q[kQK];
};
static_assert(sizeof(ActBlock) == 40, "ActBlock is 40 bytes");

inline int64_t row_groups(int64_t rows) { return (rows + kRowsPerGroup - 1) / kRowsPerGroup; }

// Bytes a rows x k Q4_1 matrix takes once repacked (k a multiple of 32).
inline size_t repacked_size(int64_t rows, int64_t k) {
    return (size_t)row_groups(rows) * (size_t)(k / kQK) * sizeof(Q4x8Block);
}

// Plain ggml Q4_1 rows (block_q4_1, row-major) <-> the repacked layout.
void repack_q4_1(const void *q4_1, int64_t rows, int64_t k, Q4x8Block *out);
void unpack_q4_1(const Q4x8Block *in, int64_t rows, int64_t k, void *q4_1);

// Weights (Q8_0, 32 weights per block: w = d*q, q a signed byte): the same row groups and
// 4-wide interleave, one byte per weight and no minimum:
//     qs[32*c + 4*r + i] = q(r, 4*c + i) + 128     (c = 0..7, i = 0..3, stored unsigned)
// The +128 makes the weights the unsigned operand of VNNI's u8 x s8 vpdpbusd, whose
// accumulator then starts at -128 * (the four activations' sum): exact integers, no sign
// tricks per row. Padding rows are zero (d = 0).
struct Q8x8Block {
    uint16_t d[kRowsPerGroup];  // fp16 scales of the eight rows
    uint8_t qs[kRowsPerGroup * kQK];
};
static_assert(sizeof(Q8x8Block) == 272, "Q8x8Block packs like eight block_q8_0");

inline size_t repacked_size_q8_0(int64_t rows, int64_t k) {
    return (size_t)row_groups(rows) * (size_t)(k / kQK) * sizeof(Q8x8Block);
}

// Plain ggml Q8_0 rows (block_q8_0, row-major) <-> the repacked layout.
void repack_q8_0(const void *q8_0, int64_t rows, int64_t k, Q8x8Block *out);
void unpack_q8_0(const Q8x8Block *in, int64_t rows, int64_t k, void *q8_0);

// Weights (Q4_0, 32 weights per block: w = d*(q - 8), q in 0..15): Q4_1's nibble layout without
// the minimum. A kernel adds the unsigned nibbles' products and then the exact integer
// -8 x (the block's activation sum), so each block's integer is sum((q - 8) * q_a), ggml's.
struct Q40x8Block {
    uint16_t d[kRowsPerGroup];  // fp16 scales of the eight rows
    uint8_t qs[kRowsPerGroup * kQK / 2];
};
static_assert(sizeof(Q40x8Block) == 144, "Q40x8Block packs like eight block_q4_0");

// Weights (Q5_0: w = d*(q - 16), q = the nibble | the fifth bit << 4, in 0..31): Q4_0's nibbles
// and a plane of fifth bits laid out for the same 4-wide chunks. Byte 4*r + i of qh holds row
// r's fifth bits of positions 4*c + i in its bit c (c = 0..7): chunk c's bits for all eight
// rows are one mask and a shift of the plane away. The integer starts at -16 x the activation sum.
struct Q50x8Block {
    uint16_t d[kRowsPerGroup];  // fp16 scales of the eight rows
    uint8_t qh[kRowsPerGroup * 4];
    uint8_t qs[kRowsPerGroup * kQK / 2];
};
static_assert(sizeof(Q50x8Block) == 176, "Q50x8Block packs like eight block_q5_0");

inline size_t repacked_size_q4_0(int64_t rows, int64_t k) {
    return (size_t)row_groups(rows) * (size_t)(k / kQK) * sizeof(Q40x8Block);
}
inline size_t repacked_size_q5_0(int64_t rows, int64_t k) {
    return (size_t)row_groups(rows) * (size_t)(k / kQK) * sizeof(Q50x8Block);
}

// Weights (Q5_1: w = d*q + m, q = the nibble | the fifth bit << 4, in 0..31): Q4_1's scales,
// minimums and nibbles with Q5_0's plane of fifth bits; Q4_1's arithmetic (kernels.h). What
// llama-quantize gives a Q5_K_M file's matrices that 256 does not divide.
struct Q51x8Block {
    uint16_t d[kRowsPerGroup];  // fp16 scales of the eight rows
    uint16_t m[kRowsPerGroup];  // fp16 minimums
    uint8_t qh[kRowsPerGroup * 4];
    uint8_t qs[kRowsPerGroup * kQK / 2];
};
static_assert(sizeof(Q51x8Block) == 192, "Q51x8Block packs like eight block_q5_1");

inline size_t repacked_size_q5_1(int64_t rows, int64_t k) {
    return (size_t)row_groups(rows) * (size_t)(k / kQK) * sizeof(Q51x8Block);
}

// Plain ggml Q4_0 / Q5_0 / Q5_1 rows <-> the repacked layouts.
void repack_q4_0(const void *q4_0, int64_t rows, int64_t k, Q40x8Block *out);
void unpack_q4_0(const Q40x8Block *in, int64_t rows, int64_t k, void *q4_0);
void repack_q5_0(const void *q5_0, int64_t rows, int64_t k, Q50x8Block *out);
void unpack_q5_0(const Q50x8Block *in, int64_t rows, int64_t k, void *q5_0);
void repack_q5_1(const void *q5_1, int64_t rows, int64_t k, Q51x8Block *out);
void unpack_q5_1(const Q51x8Block *in, int64_t rows, int64_t k, void *q5_1);

// Row `row` of a repacked rows x k Q4_0, Q4_1, Q5_0 or Q5_1 matrix as ggml's plain blocks (one
// row's worth, k / 32 of them): what a GET_ROWS hands to ggml's own dequantization.
void unpack_row_32(int type, const void *packed, int64_t k, int64_t row, void *plain);

// Row r's fifth bit of position p (0..31) in a Q5_0 or Q5_1 group block (layout above).
template <class Block>
inline int q5_high_bit(const Block &b, int r, int p) { return (b.qh[4 * r + p % 4] >> (p / 4)) & 1; }

}  // namespace stackd
