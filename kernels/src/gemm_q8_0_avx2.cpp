// The Q8_0 AVX2 path (with FMA and F16C), compiled for those instructions by the target
// pragma, chosen at run time. Without VNNI the u8 x s8 product is vpmaddubsw, whose int16
// pair sums would overflow on q + 128 (2 x 255 x 127), so this path takes the weights back to
// signed bytes and uses ggml's own sign trick: |q_w| times q_a carrying q_w's sign (pairs
// stay within 2 x 128 x 127). The integers are exact either way; lane arithmetic as kernels.h.
#include <immintrin.h>

#include <cstring>

#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace stackd {

namespace {

inline __m256i broadcast_quad(const ActBlock &a, int chunk) {
    int32_t quad;
    std::memcpy(&quad, a.q + 4 * chunk, sizeof quad);
    return _mm256_set1_epi32(quad);
}

// One group (8 rows) against one token over all K-blocks; out receives 8 floats. One token
// at a time: the eight accumulators, the weights and the constants fill the 16 registers.
inline void group_dot(const Q8x8Block *wg, int64_t nb, const ActBlock *act, float *out) {
    const __m256i offset = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 lane[8];
    for (int c = 0; c < 8; c++) lane[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const Q8x8Block &blk = wg[b];
        const ActBlock &a = act[b];
        const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk.d)),
                                           _mm256_set1_ps(a.d));
        for (int c = 0; c < 8; c++) {
            const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk.qs + 32 * c)), offset);
            const __m256i dot = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(broadcast_quad(a, c), q)), ones);
            lane[c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), lane[c]);
        }
    }
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(lane[0], lane[4]), _mm256_add_ps(lane[2], lane[6])),
                                        _mm256_add_ps(_mm256_add_ps(lane[1], lane[5]), _mm256_add_ps(lane[3], lane[7]))));
}

}  // namespace

void gemm_q8_0_avx2(const Q8x8Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
                    const ActBlock *act, int64_t n_tokens, float *dst, int64_t dst_stride) {
    alignas(32) float out[kRowsPerGroup];
    for (int64_t g = g_begin; g < g_end; g++) {
        for (int64_t t = 0; t < n_tokens; t++) {
            group_dot(w + g * nb, nb, act + t * nb, out);
            store_group(dst + t * dst_stride, out, g * kRowsPerGroup, rows);
        }
    }
}

}  // namespace stackd

#pragma GCC pop_options
