// Decode attention's AVX-512 body: attention_body.h on one 16-float register (attention.h's
// arithmetic; F16C converts K, V and the mask). Compiled for those instructions by the pragma,
// chosen at run time with the matmul path (cpu_features.cpp).
// GCC 12 flags the _mm512_undefined_* inside its own intrinsic headers:
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#include "attention_body.h"
#include "attention_lanes.h"

namespace stackd {

namespace {

struct Avx512Pack {
    using F = __m512;
    static constexpr int kValueChunks = 4;  // 4 accumulators of V a row
    static constexpr int kValueRows = 4;    // rows x chunks: 16 of the 32 registers, V's 4 beside
    static F zero() { return _mm512_setzero_ps(); }
    static F set1(float x) { return _mm512_set1_ps(x); }
    static F load(const float *x) { return _mm512_loadu_ps(x); }
    static F load_f16(const uint16_t *h) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)); }
    static void store(float *x, F a) { _mm512_storeu_ps(x, a); }
    static F load_q8(const int8_t *q, uint16_t d) {
        const F values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
        return _mm512_mul_ps(values, _mm512_set1_ps(_cvtsh_ss(d)));
    }
    static F round_f16(F x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
    static F add(F a, F b) { return _mm512_add_ps(a, b); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static F select(uint32_t bits, F a, F b) { return _mm512_mask_blend_ps((__mmask16)bits, b, a); }
    // Lanes l and l + 8 combined first (attention.h's tree), then attention_lanes.h's steps.
    template <class Combine>
    static float fold16(F a, Combine combine) {
        const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
        return attention_lanes::fold8(combine(_mm512_castps512_ps256(a), hi), combine);
    }
    static float max16(F a) { return fold16(a, attention_lanes::Max{}); }
    static float sum16(F a) { return fold16(a, attention_lanes::Add{}); }

    // Lane c: sum16(a[c]), the same pairs added in the same order, four steps over all sixteen
    // at once. Each step halves what a pack holds of its cells and puts two packs into one:
    // lanes l and l + 8 (a cell's 128-bit quarters 0-1 with 2-3), then l and l + 4 (quarter 0
    // with 1), l and l + 2, l and l + 1 (within a quarter). The last pack holds cell i + 4j in
    // lane 4i + j; one permute puts them in order.
    static F sums16(const F *a) {
        F b[8], c[4], d[2];
        for (int i = 0; i < 8; i++)
            b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        for (int i = 0; i < 4; i++)
            c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
        for (int i = 0; i < 2; i++)
            d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        const F e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        return _mm512_permutexvar_ps(order, e);
    }

    static F exp16(F x) {
        const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpFloor), _CMP_GE_OQ);
        const F n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        F r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
        r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
        F p = _mm512_set1_ps(kExpPoly[0]);
        for (int i = 1; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
        const F y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
        const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
        return _mm512_maskz_mul_ps(keep, y, _mm512_castsi512_ps(e));
    }

    static uint32_t unmasked(const uint16_t *mask) {
        const __m256i m = _mm256_loadu_si256((const __m256i *)mask);
        return _mm256_cmpneq_epi16_mask(m, _mm256_set1_epi16((short)kMaskedBits));
    }
};

}  // namespace

void attend_avx512(const AttentionTask &task) { attention_body::attend<Avx512Pack>(task); }

}  // namespace stackd

#pragma GCC pop_options
