#include "layout.h"

#include <cstring>

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

}  // namespace

void repack_q4_1(const void *q4_1, int64_t rows, int64_t k, Q4x8Block *out) {
    const int64_t nb = k / kQK, groups = row_groups(rows);
    const block_q4_1 *src = static_cast<const block_q4_1 *>(q4_1);
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t b = 0; b < nb; b++) {
            Q4x8Block &dst = out[g * nb + b];
            std::memset(&dst, 0, sizeof dst);
            for (int r = 0; r < kRowsPerGroup; r++) {
                const int64_t row = g * kRowsPerGroup + r;
                if (row >= rows) break;  // padding rows stay zero: d = m = 0
                const block_q4_1 &blk = src[row * nb + b];
                dst.d[r] = q4_1_d(blk);
                dst.m[r] = q4_1_m(blk);
                for (int j = 0; j < kChunks; j++)
                    std::memcpy(&dst.qs[32 * j + kChunkBytes * r], &blk.qs[kChunkBytes * j], kChunkBytes);
            }
        }
    }
}

void unpack_q4_1(const Q4x8Block *in, int64_t rows, int64_t k, void *q4_1) {
    const int64_t nb = k / kQK;
    block_q4_1 *dst = static_cast<block_q4_1 *>(q4_1);
    for (int64_t row = 0; row < rows; row++) {
        const int64_t g = row / kRowsPerGroup;
        const int r = (int)(row % kRowsPerGroup);
        for (int64_t b = 0; b < nb; b++) {
            const Q4x8Block &src = in[g * nb + b];
            block_q4_1 &blk = dst[row * nb + b];
            q4_1_d(blk) = src.d[r];
            q4_1_m(blk) = src.m[r];
            for (int j = 0; j < kChunks; j++)
                std::memcpy(&blk.qs[kChunkBytes * j], &src.qs[32 * j + kChunkBytes * r], kChunkBytes);
        }
    }
}

namespace {

static_assert(sizeof(block_q8_0) == 34, "block_q8_0 as ggml defines it");
constexpr uint8_t kOffset = 0x80;  // q + 128 as an unsigned byte: flipping the top bit

}  // namespace

void repack_q8_0(const void *q8_0, int64_t rows, int64_t k, Q8x8Block *out) {
    const int64_t nb = k / kQK, groups = row_groups(rows);
    const block_q8_0 *src = static_cast<const block_q8_0 *>(q8_0);
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t b = 0; b < nb; b++) {
            Q8x8Block &dst = out[g * nb + b];
            std::memset(&dst, 0, sizeof dst);
            for (int r = 0; r < kRowsPerGroup; r++) {
                const int64_t row = g * kRowsPerGroup + r;
                if (row >= rows) break;  // padding rows stay zero: d = 0
                const block_q8_0 &blk = src[row * nb + b];
                dst.d[r] = blk.d;
                for (int p = 0; p < kQK; p++)
                    dst.qs[32 * (p / 4) + 4 * r + p % 4] = (uint8_t)blk.qs[p] ^ kOffset;
            }
        }
    }
}

void unpack_q8_0(const Q8x8Block *in, int64_t rows, int64_t k, void *q8_0) {
    const int64_t nb = k / kQK;
    block_q8_0 *dst = static_cast<block_q8_0 *>(q8_0);
    for (int64_t row = 0; row < rows; row++) {
        const int64_t g = row / kRowsPerGroup;
        const int r = (int)(row % kRowsPerGroup);
        for (int64_t b = 0; b < nb; b++) {
            const Q8x8Block &src = in[g * nb + b];
            block_q8_0 &blk = dst[row * nb + b];
            blk.d = src.d[r];
            for (int p = 0; p < kQK; p++)
                blk.qs[p] = (int8_t)(src.qs[32 * (p / 4) + 4 * r + p % 4] ^ kOffset);
        }
    }
}

}  // namespace stackd
