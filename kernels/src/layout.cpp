#include "layout.h"

#include <cstring>

#include "ggml.h"
#include "ggml_q4_1.h"

namespace stackd {

namespace {

static_assert(sizeof(block_q4_1) == 20, "block_q4_1 as ggml defines it");

// ggml's block byte qs[p] (p = 0..15) holds position p in its low nibble and position p + 16
// in its high one. Our byte qs[32*j + 4*r + i] holds U(r, 4*j + i) | U(r, 4*(j+4) + i) << 4
// (layout.h): with p = 4*j + i that is exactly ggml's byte p of row r. So repacking moves
// each row's 16 bytes, 4 at a time, to its lane of the group; no nibble is touched.
constexpr int kChunks = 4;      // j: four 4-byte chunks of a block's 16 bytes
constexpr int kChunkBytes = 4;  // i: four consecutive positions

// A block's 16 nibble bytes, between ggml's block and row r's lane of the group's block, both
// ways (Q4_1, Q4_0, Q5_0 and Q5_1 share the layout).
void nibbles_to_lane(const uint8_t *qs, int r, uint8_t *lanes) {
    for (int j = 0; j < kChunks; j++) std::memcpy(&lanes[32 * j + kChunkBytes * r], &qs[kChunkBytes * j], kChunkBytes);
}

void nibbles_from_lane(const uint8_t *lanes, int r, uint8_t *qs) {
    for (int j = 0; j < kChunks; j++) std::memcpy(&qs[kChunkBytes * j], &lanes[32 * j + kChunkBytes * r], kChunkBytes);
}

// Row r's K-block, between ggml's block and its lane of the group's block, both ways.
void to_lane(const block_q4_1 &blk, int r, Q4x8Block &dst) {
    dst.d[r] = q4_1_d(blk);
    dst.m[r] = q4_1_m(blk);
    nibbles_to_lane(blk.qs, r, dst.qs);
}

void from_lane(const Q4x8Block &src, int r, block_q4_1 &blk) {
    q4_1_d(blk) = src.d[r];
    q4_1_m(blk) = src.m[r];
    nibbles_from_lane(src.qs, r, blk.qs);
}

static_assert(sizeof(block_q8_0) == 34, "block_q8_0 as ggml defines it");
constexpr uint8_t kOffset = 0x80;  // q + 128 as an unsigned byte: flipping the top bit

void to_lane(const block_q8_0 &blk, int r, Q8x8Block &dst) {
    dst.d[r] = blk.d;
    for (int p = 0; p < kQK; p++) dst.qs[32 * (p / 4) + 4 * r + p % 4] = (uint8_t)blk.qs[p] ^ kOffset;
}

void from_lane(const Q8x8Block &src, int r, block_q8_0 &blk) {
    blk.d = src.d[r];
    for (int p = 0; p < kQK; p++) blk.qs[p] = (int8_t)(src.qs[32 * (p / 4) + 4 * r + p % 4] ^ kOffset);
}

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 as ggml defines it");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 as ggml defines it");

void to_lane(const block_q4_0 &blk, int r, Q40x8Block &dst) {
    dst.d[r] = blk.d;
    nibbles_to_lane(blk.qs, r, dst.qs);
}

void from_lane(const Q40x8Block &src, int r, block_q4_0 &blk) {
    blk.d = src.d[r];
    nibbles_from_lane(src.qs, r, blk.qs);
}

// ggml's qh is a little-endian uint32 whose bit p is position p's fifth bit; ours, row r's
// four bytes of the group's plane (layout.h). Both ways, for Q5_0 and Q5_1.
void fifth_bits_to_lane(const uint8_t *ggml_qh, int r, uint8_t *plane) {
    uint32_t qh;
    std::memcpy(&qh, ggml_qh, sizeof qh);
    for (int i = 0; i < 4; i++) {
        uint8_t bits = 0;
        for (int c = 0; c < 8; c++) bits |= (uint8_t)(((qh >> (4 * c + i)) & 1) << c);
        plane[4 * r + i] = bits;
    }
}

template <class Packed>
void fifth_bits_from_lane(const Packed &src, int r, uint8_t *ggml_qh) {
    uint32_t qh = 0;
    for (int p = 0; p < kQK; p++) qh |= (uint32_t)q5_high_bit(src, r, p) << p;
    std::memcpy(ggml_qh, &qh, sizeof qh);
}

void to_lane(const block_q5_0 &blk, int r, Q50x8Block &dst) {
    dst.d[r] = blk.d;
    nibbles_to_lane(blk.qs, r, dst.qs);
    fifth_bits_to_lane(blk.qh, r, dst.qh);
}

void from_lane(const Q50x8Block &src, int r, block_q5_0 &blk) {
    blk.d = src.d[r];
    nibbles_from_lane(src.qs, r, blk.qs);
    fifth_bits_from_lane(src, r, blk.qh);
}

static_assert(sizeof(block_q5_1) == 24, "block_q5_1 as ggml defines it");

void to_lane(const block_q5_1 &blk, int r, Q51x8Block &dst) {
    dst.d[r] = q5_1_d(blk);
    dst.m[r] = q5_1_m(blk);
    nibbles_to_lane(blk.qs, r, dst.qs);
    fifth_bits_to_lane(blk.qh, r, dst.qh);
}

void from_lane(const Q51x8Block &src, int r, block_q5_1 &blk) {
    q5_1_d(blk) = src.d[r];
    q5_1_m(blk) = src.m[r];
    nibbles_from_lane(src.qs, r, blk.qs);
    fifth_bits_from_lane(src, r, blk.qh);
}

// Plain ggml rows (row-major blocks of Plain) -> the repacked groups; padding rows stay zero
// (d = m = 0).
template <class Plain, class Packed>
void repack_rows(const void *plain, int64_t rows, int64_t k, Packed *out) {
    const int64_t nb = k / kQK, groups = row_groups(rows);
    const Plain *src = static_cast<const Plain *>(plain);
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t b = 0; b < nb; b++) {
            Packed &dst = out[g * nb + b];
            std::memset(&dst, 0, sizeof dst);
            for (int r = 0; r < kRowsPerGroup && g * kRowsPerGroup + r < rows; r++)
                to_lane(src[(g * kRowsPerGroup + r) * nb + b], r, dst);
        }
    }
}

template <class Plain, class Packed>
void unpack_rows(const Packed *in, int64_t rows, int64_t k, void *plain) {
    const int64_t nb = k / kQK;
    Plain *dst = static_cast<Plain *>(plain);
    for (int64_t row = 0; row < rows; row++)
        for (int64_t b = 0; b < nb; b++)
            from_lane(in[row / kRowsPerGroup * nb + b], (int)(row % kRowsPerGroup), dst[row * nb + b]);
}

}  // namespace

void repack_q4_1(const void *q4_1, int64_t rows, int64_t k, Q4x8Block *out) {
    repack_rows<block_q4_1>(q4_1, rows, k, out);
}

void unpack_q4_1(const Q4x8Block *in, int64_t rows, int64_t k, void *q4_1) {
    unpack_rows<block_q4_1>(in, rows, k, q4_1);
}

void repack_q8_0(const void *q8_0, int64_t rows, int64_t k, Q8x8Block *out) {
    repack_rows<block_q8_0>(q8_0, rows, k, out);
}

void unpack_q8_0(const Q8x8Block *in, int64_t rows, int64_t k, void *q8_0) {
    unpack_rows<block_q8_0>(in, rows, k, q8_0);
}

template <class Plain, class Packed>
void unpack_one_row(const void *packed, int64_t k, int64_t row, void *plain) {
    const int64_t nb = k / kQK;
    const Packed *group = static_cast<const Packed *>(packed) + row / kRowsPerGroup * nb;
    Plain *dst = static_cast<Plain *>(plain);
    for (int64_t b = 0; b < nb; b++) from_lane(group[b], (int)(row % kRowsPerGroup), dst[b]);
}

void unpack_row_32(int type, const void *packed, int64_t k, int64_t row, void *plain) {
    switch (type) {
        case GGML_TYPE_Q4_0: unpack_one_row<block_q4_0, Q40x8Block>(packed, k, row, plain); break;
        case GGML_TYPE_Q5_0: unpack_one_row<block_q5_0, Q50x8Block>(packed, k, row, plain); break;
        case GGML_TYPE_Q5_1: unpack_one_row<block_q5_1, Q51x8Block>(packed, k, row, plain); break;
        default: unpack_one_row<block_q4_1, Q4x8Block>(packed, k, row, plain); break;
    }
}

void repack_q4_0(const void *q4_0, int64_t rows, int64_t k, Q40x8Block *out) {
    repack_rows<block_q4_0>(q4_0, rows, k, out);
}

void unpack_q4_0(const Q40x8Block *in, int64_t rows, int64_t k, void *q4_0) {
    unpack_rows<block_q4_0>(in, rows, k, q4_0);
}

void repack_q5_0(const void *q5_0, int64_t rows, int64_t k, Q50x8Block *out) {
    repack_rows<block_q5_0>(q5_0, rows, k, out);
}

void unpack_q5_0(const Q50x8Block *in, int64_t rows, int64_t k, void *q5_0) {
    unpack_rows<block_q5_0>(in, rows, k, q5_0);
}

void repack_q5_1(const void *q5_1, int64_t rows, int64_t k, Q51x8Block *out) {
    repack_rows<block_q5_1>(q5_1, rows, k, out);
}

void unpack_q5_1(const Q51x8Block *in, int64_t rows, int64_t k, void *q5_1) {
    unpack_rows<block_q5_1>(in, rows, k, q5_1);
}

}  // namespace stackd
