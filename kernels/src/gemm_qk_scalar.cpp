// The K-quant reference paths: plain C++, the arithmetic every SIMD path reproduces
// (kernels_qk.h), on the tile driver every path runs (tiles.h).
#include <cmath>

#include "ggml.h"
#include "kernels.h"
#include "kernels_qk.h"
#include "tiles.h"

namespace stackd {

namespace {

// Row r's value at position 32 s + 4 c + i (sub-block s, chunk c) of a Q4_K / Q5_K block.
int q4k_value(const Q4Kx8Block &w, int r, int s, int c, int i) {
    return (w.qs[256 * (s / 2) + 32 * c + 4 * r + i] >> (s % 2 ? 4 : 0)) & 0xF;
}
int q4k_value(const Q5Kx8Block &w, int r, int s, int c, int i) {
    return ((w.qs[256 * (s / 2) + 32 * c + 4 * r + i] >> (s % 2 ? 4 : 0)) & 0xF) |
           q5k_high_bit(w, r, 32 * s + 4 * c + i) << 4;
}

// Row r's exact integer sums for one super-block (kernels_qk.h).
template <class Block>
int32_t q4_k_isum(const Block &w, int r, const ActKBlock &a) {
    int32_t isum = 0;
    for (int s = 0; s < 8; s++) {
        int32_t dot = 0;
        for (int c = 0; c < 8; c++)
            for (int i = 0; i < 4; i++) dot += q4k_value(w, r, s, c, i) * a.q[32 * s + 4 * c + i];
        isum += q4k_scale(w, r, s) * dot;
    }
    return isum;
}

template <class Block>
int32_t q4_k_msum(const Block &w, int r, const ActKBlock &a) {
    int32_t msum = 0;
    for (int s = 0; s < 8; s++) msum += q4k_min(w, r, s) * a.bsum32[s];
    return msum;
}

// The 6-bit value at position p (0..63) of chunk j, row r (layout_qk.h).
int q6_value(const Q6Kx8Block &w, int r, int j, int p) {
    const int quad = p / 4, i = p % 4;
    const int lo = (w.ql[256 * j + 32 * (p % 32 / 4) + 4 * r + i] >> (p >= 32 ? 4 : 0)) & 0xF;
    const int hi = (w.qh[128 * j + 32 * (quad % 4) + 4 * r + i] >> (2 * (quad / 4))) & 3;
    return lo | hi << 4;
}

int32_t q6_k_isum(const Q6Kx8Block &w, int r, const ActKBlock &a) {
    int32_t isum = 0;
    for (int s = 0; s < 16; s++) {
        int32_t dot = -32 * a.bsum16[s];
        for (int p = 0; p < 16; p++) dot += q6_value(w, r, s / 4, 16 * (s % 4) + p) * a.q[16 * s + p];
        isum += w.sc[s][r] * dot;
    }
    return isum;
}

// The reference bodies: one group and one token a tile, row after row.
struct Reference {
    using Act = ActKBlock;
    static constexpr int kTile = 1;
    static constexpr int64_t kPairsFrom = 0;
    template <int TT, int NG> using Acc = float[TT][kRowsPerGroup];
};

template <class BlockType>
struct Q4K : Reference {
    using Block = BlockType;
    template <int TT, int NG>
    void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act, int64_t i) const {
        for (int t = 0; t < TT; t++) {
            const ActKBlock &a = act[i + t * nb];
            for (int r = 0; r < kRowsPerGroup; r++) {
                const float d = ggml_fp16_to_fp32(w->d[r]), dmin = ggml_fp16_to_fp32(w->dmin[r]);
                acc[t][r] = std::fma(d * a.d, (float)q4_k_isum(*w, r, a), acc[t][r]);
                acc[t][r] = std::fma(dmin * -a.d, (float)q4_k_msum(*w, r, a), acc[t][r]);
            }
        }
    }
};

struct Q6K : Reference {
    using Block = Q6Kx8Block;
    template <int TT, int NG>
    void add_block(Acc<TT, NG> &acc, const Block *w, int64_t nb, const ActKBlock *act, int64_t i) const {
        for (int t = 0; t < TT; t++) {
            const ActKBlock &a = act[i + t * nb];
            for (int r = 0; r < kRowsPerGroup; r++)
                acc[t][r] = std::fma(ggml_fp16_to_fp32(w->d[r]) * a.d, (float)q6_k_isum(*w, r, a), acc[t][r]);
        }
    }
};

}  // namespace

KQuantKernels scalar_kquant_kernels() {
    return {tiles::run<Q4K<Q4Kx8Block>>, tiles::run<Q6K>, tiles::run<Q4K<Q5Kx8Block>>};
}

KQuantKernels kquant_kernels_for(Path path) {
    switch (path) {
#if defined(__x86_64__) || defined(__i386__)
        case Path::Avx512: return avx512_kquant_kernels();
        case Path::Avx2: return avx2_kquant_kernels();
#elif defined(__aarch64__)
        case Path::NeonI8mm:   // the K-quants' sub-block scales sit per row: sdot's shape, not smmla's
        case Path::NeonDot: return neon_kquant_kernels();
#endif
        default: break;        // scalar, or another architecture's path (cpu_supports says no)
    }
    return scalar_kquant_kernels();
}

}  // namespace stackd
