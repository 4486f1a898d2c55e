// The Q8_0 AVX2 path (with FMA and F16C), compiled for those instructions by the target
// pragma, chosen at run time. Without VNNI the u8 x s8 product is vpmaddubsw, whose int16
// pair sums would overflow on q + 128 (2 x 255 x 127), so this path takes the weights back to
// signed bytes and uses ggml's own sign trick: |q_w| times q_a carrying q_w's sign (pairs
// stay within 2 x 128 x 127). The integers are exact either way; float arithmetic as kernels.h.
#include <immintrin.h>

#include <cstring>

#include "kernels.h"
#include "prefetch.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "tiles.h"

namespace stackd {

namespace {

constexpr int kTile = 4;  // an integer and a float accumulator a token, as gemm_avx2.cpp

inline __m256i broadcast_quad(const ActBlock &a, int chunk) {
    int32_t quad;
    std::memcpy(&quad, a.q + 4 * chunk, sizeof quad);
    return _mm256_set1_epi32(quad);
}

// One group (8 rows) against TT tokens over all K-blocks; out receives TT x 8 floats. Each of
// the block's eight 32-byte steps is loaded and made signed once for every token.
template <int TT>
inline void group_tile(const Q8x8Block *wg, int64_t nb, const ActBlock *act, float *out) {
    const __m256i offset = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TT];
    for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead(wg, nb, b);
        const Q8x8Block &blk = wg[b];
        __m256i isum[TT];
        for (int t = 0; t < TT; t++) isum[t] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk.qs + 32 * c)), offset);
            const __m256i magnitude = _mm256_sign_epi8(q, q);
            for (int t = 0; t < TT; t++) {
                const __m256i signed_a = _mm256_sign_epi8(broadcast_quad(act[t * nb + b], c), q);
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_a), ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk.d));
        for (int t = 0; t < TT; t++) {
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(act[t * nb + b].d));
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) _mm256_storeu_ps(out + 8 * t, acc[t]);
}

}  // namespace

void gemm_q8_0_avx2(const Q8x8Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                    const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    tiles::for_groups<kTile>(g_begin, g_end, rows, n_tokens, dst, dst_stride,
                             [&](auto tt, int64_t g, int64_t t, float *out) {
                                 group_tile<decltype(tt)::value>(w + g * nb, nb, act + t * nb, out);
                             });
}

}  // namespace stackd

#pragma GCC pop_options
