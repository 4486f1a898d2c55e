// The activation quantizers with AVX2 (quantize_x86.h), each function compiled for its target
// by attribute, so the library still loads on any x86-64.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "ggml.h"
#include "quantize_x86.h"

namespace stackd {

namespace {

// A float rounded to fp16 (to nearest even, as ggml's F16C conversion) and back, inline: the
// ggml-base functions cost a call through the PLT each, two per block.
__attribute__((target("f16c")))
inline float through_fp16(float x) {
    return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}

}  // namespace

// The same with AVX2, as ggml's own x86 code does it (max of |x| by lanes, round to nearest
// even, saturating packs restored to order by a lane permutation): the scalar loop above
// called libm's fmaxf and nearbyintf through the PLT for every value (quantize.cpp).
__attribute__((target("avx2,fma,f16c")))
void quantize_row_avx2(const float *x, int64_t k, ActBlock *out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < k / kQK; b++, x += kQK) {
        __m256 v[4];
        __m256 amax8 = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 h = _mm_max_ps(_mm256_extractf128_ps(amax8, 1), _mm256_castps256_ps128(amax8));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        const __m256 mul = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) {
            q[j] = _mm256_cvtps_epi32(
                _mm256_round_ps(_mm256_mul_ps(v[j], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        const __m256i sum8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_extracti128_si256(sum8, 1), _mm256_castsi256_si128(sum8));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
        const int sum = _mm_cvtsi128_si32(s4);
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out[b].q), _mm256_permutevar8x32_epi32(packed, order));
        out[b].d = through_fp16(d);
        out[b].s = through_fp16(d * (float)sum);
    }
}


// quantize_row_k_scalar (layout_qk.cpp) with AVX2, byte for byte: the first value of the
// largest magnitude found by a max over lanes (a NaN never wins, as in the scalar comparison)
// and then the first lane equal to it; ggml's nearest_int through the float adder, lane by
// lane, and the int8 cast as truncation (the low byte of each lane, not a saturating pack),
// so even a NaN or an infinity gives the scalar's bytes. At 16 tokens the scalar loop was
// 2.8 % of a decode step of the Q4_K_M file (its ffn_down input, 1,536 wide, every layer).
__attribute__((target("avx2,fma,f16c")))
void quantize_row_k_avx2(const float *x, int64_t k, ActKBlock *out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 magic = _mm256_set1_ps(12582912.f);
    const __m256i mantissa = _mm256_set1_epi32(0x007fffff), bias = _mm256_set1_epi32(0x00400000);
    const __m256i top = _mm256_set1_epi32(127);
    // the low byte of each int32 lane to the lane's first four bytes, then the two halves' words together
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i gather = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    for (int64_t b = 0; b < k / kQK_K; b++, x += kQK_K) {
        ActKBlock &y = out[b];
        __m256 amax8 = _mm256_setzero_ps();
        for (int j = 0; j < kQK_K; j += 8) amax8 = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), amax8);
        __m128 h = _mm_max_ps(_mm256_extractf128_ps(amax8, 1), _mm256_castps256_ps128(amax8));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (!(amax > 0)) {
            std::memset(&y, 0, sizeof y);
            continue;
        }
        float max = 0;
        const __m256 wanted = _mm256_set1_ps(amax);
        for (int j = 0; j < kQK_K; j += 8) {
            const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), wanted, _CMP_EQ_OQ));
            if (hits != 0) {
                max = x[j + __builtin_ctz(hits)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 scale = _mm256_set1_ps(iscale);
        for (int j = 0; j < kQK_K; j += 8) {
            const __m256 v = _mm256_add_ps(_mm256_mul_ps(scale, _mm256_loadu_ps(x + j)), magic);
            __m256i q = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mantissa), bias);
            q = _mm256_min_epi32(q, top);
            const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(q, low_bytes), gather);
            _mm_storel_epi64(reinterpret_cast<__m128i *>(y.q + j), _mm256_castsi256_si128(bytes));
        }
        const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
        for (int j = 0; j < kQK_K; j += 32) {   // two 16-position sums per 32 bytes
            const __m256i quads = _mm256_madd_epi16(
                _mm256_maddubs_epi16(ones8, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(y.q + j))), ones16);
            const __m256i pairs = _mm256_hadd_epi32(quads, quads);           // lane sums of 8, per half
            const __m256i sixteen = _mm256_hadd_epi32(pairs, pairs);        // of 16, per half
            y.bsum16[j / 16] = (int16_t)_mm256_extract_epi32(sixteen, 0);
            y.bsum16[j / 16 + 1] = (int16_t)_mm256_extract_epi32(sixteen, 4);
        }
        for (int j = 0; j < 8; j++) y.bsum32[j] = (int16_t)(y.bsum16[2 * j] + y.bsum16[2 * j + 1]);
        y.d = 1 / iscale;
    }
}


}  // namespace stackd
