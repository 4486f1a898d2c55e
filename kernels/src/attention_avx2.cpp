// Decode attention's AVX2 body: attention_body.h on a pair of 8-float registers, lanes 0-7 and
// 8-15 of attention.h's sixteen (so sum16's first step is one add of the pair). Compiled for
// AVX2, FMA and F16C by the pragma, chosen at run time with the matmul path.
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "attention_body.h"
#include "attention_lanes.h"

namespace stackd {

namespace {

struct Avx2Pack {
    struct F {
        __m256 lo, hi;
    };
    static constexpr int kValueChunks = 2;  // 2 rows x 2 x (lo, hi): 8 of the 16 registers
    static F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
    static F set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
    static F load(const float *x) { return {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)}; }
    static F load_f16(const uint16_t *h) {
        return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)),
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 8)))};
    }
    static __m256 q8x8(const int8_t *q, float d) {
        const __m256 values = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
        return _mm256_mul_ps(values, _mm256_set1_ps(d));
    }
    static F load_q8(const int8_t *q, uint16_t d) { return {q8x8(q, _cvtsh_ss(d)), q8x8(q + 8, _cvtsh_ss(d))}; }
    static void store(float *x, F a) {
        _mm256_storeu_ps(x, a.lo);
        _mm256_storeu_ps(x + 8, a.hi);
    }
    static __m256 round8(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
    static F round_f16(F x) { return {round8(x.lo), round8(x.hi)}; }
    static F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
    static F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
    static F fma(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }

    // Lane l of the result is all ones where bit l is set.
    static __m256 lanes_of(uint32_t bits) {
        const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        const __m256i b = _mm256_set1_epi32((int)bits);
        return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, bit), bit));
    }
    static F select(uint32_t bits, F a, F b) {
        return {_mm256_blendv_ps(b.lo, a.lo, lanes_of(bits)), _mm256_blendv_ps(b.hi, a.hi, lanes_of(bits >> 8))};
    }

    // Lanes 0-7 and 8-15 combined first (attention.h's tree), then attention_lanes.h's steps.
    static float sum16(F a) { return attention_lanes::fold8(_mm256_add_ps(a.lo, a.hi), attention_lanes::Add{}); }
    static float max16(F a) { return attention_lanes::fold8(_mm256_max_ps(a.lo, a.hi), attention_lanes::Max{}); }

    // Lane c: sum16(a[c]), the same pairs added in the same order, over all sixteen at once:
    // lo + hi (lanes l and l + 8); then for two cells at a time their 128-bit halves (l and
    // l + 4), cell 2i in the low half of the result, 2i + 1 in the high; then l and l + 2 and
    // l and l + 1 within a half, two halves' worth of cells a step. The last pair holds cells
    // 8k + 2i in the low half and 8k + 2i + 1 in the high; one permute each puts them in order.
    static F sums16(const F *a) {
        __m256 u[16], v[8], w[4], z[2];
        for (int c = 0; c < 16; c++) u[c] = _mm256_add_ps(a[c].lo, a[c].hi);
        for (int i = 0; i < 8; i++)
            v[i] = _mm256_add_ps(_mm256_permute2f128_ps(u[2 * i], u[2 * i + 1], 0x20),
                                 _mm256_permute2f128_ps(u[2 * i], u[2 * i + 1], 0x31));
        for (int i = 0; i < 4; i++)
            w[i] = _mm256_add_ps(_mm256_shuffle_ps(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        for (int i = 0; i < 2; i++)
            z[i] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        return {_mm256_permutevar8x32_ps(z[0], order), _mm256_permutevar8x32_ps(z[1], order)};
    }

    static __m256 exp8(__m256 x) {
        const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(kExpFloor), _CMP_GE_OQ);
        const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
        r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
        __m256 p = _mm256_set1_ps(kExpPoly[0]);
        for (int i = 1; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
        const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
    }
    static F exp16(F x) { return {exp8(x.lo), exp8(x.hi)}; }

    static uint32_t unmasked(const uint16_t *mask) {
        const __m256i m = _mm256_loadu_si256((const __m256i *)mask);
        const __m256i masked = _mm256_cmpeq_epi16(m, _mm256_set1_epi16((short)kMaskedBits));
        const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(masked), _mm256_extracti128_si256(masked, 1));
        return ~(uint32_t)_mm_movemask_epi8(bytes) & 0xFFFFu;
    }
};

}  // namespace

void attend_avx2(const AttentionTask &task) { attention_body::attend<Avx2Pack>(task); }

}  // namespace stackd

#pragma GCC pop_options
