#include "layout.h"

#include <cstring>

#include "ggml_q4_1.h"

namespace stackd {

namespace {

static_assert(sizeof(block_q4_1) == 20, "block_q4_1 as ggml defines it");

// The 4-bit value at position k (0..31) of a ggml Q4_1 block.
inline uint8_t nibble(const block_q4_1 &b, int k) {
    return k < 16 ? (b.qs[k] & 0x0F) : (b.qs[k - 16] >> 4);
}

inline void set_nibble(block_q4_1 &b, int k, uint8_t v) {
    if (k < 16) b.qs[k] = (uint8_t)((b.qs[k] & 0xF0) | v);
    else b.qs[k - 16] = (uint8_t)((b.qs[k - 16] & 0x0F) | (v << 4));
}

// Where position k of row r lives in a Q4x8Block: byte index and shift.
inline void locate(int r, int k, int *byte, int *shift) {
    const int chunk = k / 4, i = k % 4;  // chunk 0..7 holds positions 4*chunk .. 4*chunk+3
    *byte = 32 * (chunk % 4) + 4 * r + i;
    *shift = chunk >= 4 ? 4 : 0;
}

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
                for (int pos = 0; pos < kQK; pos++) {
                    int byte, shift;
                    locate(r, pos, &byte, &shift);
                    dst.qs[byte] |= (uint8_t)(nibble(blk, pos) << shift);
                }
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
            for (int pos = 0; pos < kQK; pos++) {
                int byte, shift;
                locate(r, pos, &byte, &shift);
                set_nibble(blk, pos, (uint8_t)((src.qs[byte] >> shift) & 0x0F));
            }
        }
    }
}

}  // namespace stackd
