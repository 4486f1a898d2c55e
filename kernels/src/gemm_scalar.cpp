// The reference paths: plain C++, the arithmetic every SIMD path reproduces (kernels.h), on
// the tile driver every path runs (tiles.h).
#include <cmath>
#include <type_traits>

#include "ggml.h"
#include "kernels.h"
#include "tiles.h"

namespace stackd {

namespace {

// The exact int32 dot product of row r's block with the activation block.
int32_t block_dot(const Q4x8Block &w, int r, const ActBlock &a) {
    int32_t sum = 0;
    for (int chunk = 0; chunk < 8; chunk++) {
        const int shift = chunk >= 4 ? 4 : 0;
        for (int i = 0; i < 4; i++)
            sum += ((w.qs[32 * (chunk % 4) + 4 * r + i] >> shift) & 0x0F) * a.q[4 * chunk + i];
    }
    return sum;
}

// Row r's nibble at position p of a Q4_0 / Q5_0 / Q5_1 group block (layout.h: as Q4_1's).
template <class Block>
int nibble(const Block &w, int r, int p) {
    return (w.qs[32 * (p % 16 / 4) + 4 * r + p % 4] >> (p >= 16 ? 4 : 0)) & 0x0F;
}

int32_t block_dot(const Q40x8Block &w, int r, const ActBlock &a) {
    int32_t sum = 0;
    for (int p = 0; p < kQK; p++) sum += (nibble(w, r, p) - 8) * a.q[p];
    return sum;
}

int32_t block_dot(const Q50x8Block &w, int r, const ActBlock &a) {
    int32_t sum = 0;
    for (int p = 0; p < kQK; p++) sum += ((nibble(w, r, p) | q5_high_bit(w, r, p) << 4) - 16) * a.q[p];
    return sum;
}

int32_t block_dot(const Q51x8Block &w, int r, const ActBlock &a) {
    int32_t sum = 0;
    for (int p = 0; p < kQK; p++) sum += (nibble(w, r, p) | q5_high_bit(w, r, p) << 4) * a.q[p];
    return sum;
}

int32_t block_dot(const Q8x8Block &w, int r, const ActBlock &a) {
    int32_t sum = 0;
    for (int chunk = 0; chunk < 8; chunk++)
        for (int i = 0; i < 4; i++) sum += ((int)w.qs[32 * chunk + 4 * r + i] - 128) * a.q[4 * chunk + i];
    return sum;
}

// The reference body (tiles.h): one group and one token a tile, row after row, the float
// operations of kernels.h in their order.
template <class BlockType>
struct Reference {
    using Block = BlockType;
    static constexpr int kTile = 1;
    static constexpr int64_t kPairsFrom = 0;
    template <int TT, int NG> using Acc = float[TT][kRowsPerGroup];

    template <int TT, int NG>
    void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActBlock *act, int64_t i) const {
        for (int t = 0; t < TT; t++) {
            const ActBlock &a = act[i + t * nb];
            for (int r = 0; r < kRowsPerGroup; r++) {
                const float scale = ggml_fp16_to_fp32(w->d[r]) * a.d;
                acc[t][r] = std::fma(scale, (float)block_dot(*w, r, a), acc[t][r]);
                if constexpr (std::is_same_v<Block, Q4x8Block> || std::is_same_v<Block, Q51x8Block>)
                    acc[t][r] = std::fma(ggml_fp16_to_fp32(w->m[r]), a.s, acc[t][r]);
            }
        }
    }
};

}  // namespace

Kernels scalar_kernels() {
    return {tiles::run<Reference<Q4x8Block>>, tiles::run<Reference<Q8x8Block>>, tiles::run<Reference<Q40x8Block>>,
            tiles::run<Reference<Q50x8Block>>, tiles::run<Reference<Q51x8Block>>};
}

Kernels kernels_for(Path path) {
    // Each architecture's paths; another's never reach here (cpu_supports says no to them).
#if defined(__x86_64__) || defined(__i386__)
    Kernels kernels = path == Path::Avx512 ? avx512_kernels() : path == Path::Avx2 ? avx2_kernels() : scalar_kernels();
    kernels.attend = path == Path::Avx512 ? attend_avx512 : path == Path::Avx2 ? attend_avx2 : attend_scalar;
#elif defined(__aarch64__)
    Kernels kernels = path == Path::NeonI8mm ? neon_i8mm_kernels() : path == Path::NeonDot ? neon_kernels() : scalar_kernels();
    kernels.attend = path == Path::NeonI8mm || path == Path::NeonDot ? attend_neon : attend_scalar;
#else
    Kernels kernels = scalar_kernels();
    kernels.attend = attend_scalar;
#endif
    kernels.kquants = kquant_kernels_for(path);
    return kernels;
}

}  // namespace stackd
