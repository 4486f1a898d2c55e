// The SIMD body of decode attention (attention.h's arithmetic), written once over a 16-lane
// float pack: attention_avx2.cpp instantiates it with two 8-float registers, attention_avx512.cpp
// with one 16-float register, each under its own target pragma (as tiles.h). A pack's lanes are
// the sixteen cells of a block (scores, probabilities) or sixteen consecutive values of a row
// (K and V, the accumulators); sum16 and exp16 are the operations attention.h names.
//
// A Pack provides: F (the pack), zero, set1, load, load_f16 (16 f16 values), load_q8 (16 int8
// values times an f16 scale), store, add, mul, fma,
// round_f16 (to the nearest f16 value, ties to even), sum16, max16, exp16, select (lanes whose
// bit is set take the first pack), unmasked (the bits of sixteen mask values that
// are not -inf) and kValueChunks (how many sixteen-value chunks of V a row accumulates in
// registers at once); optionally sums16 (below) and kValueRows (ValueRows, below).
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>

#include "attention.h"

namespace stackd::attention_body {

// A cache row's values, sixteen at a time from value j (a multiple of 16), as floats.
template <class P>
struct F16Rows {
    static typename P::F load(const char *row, int64_t j) { return P::load_f16((const uint16_t *)row + j); }
    static int64_t bytes(int64_t d) { return 2 * d; }
};

// q8_0: 34-byte blocks of an f16 scale and 32 int8 values; a value is int8 x scale (exact).
template <class P>
struct Q8Rows {
    static constexpr int64_t kBlockValues = 32, kBlockBytes = 34;
    static typename P::F load(const char *row, int64_t j) {
        const char *block = row + (j / kBlockValues) * kBlockBytes;
        uint16_t d;
        __builtin_memcpy(&d, block, sizeof d);
        return P::load_q8((const int8_t *)block + 2 + j % kBlockValues, d);
    }
    static int64_t bytes(int64_t d) { return d / kBlockValues * kBlockBytes; }
};

// Asks for the K and V rows of the block from c0 ahead of their use: a decode step reads each
// stream's cache once, from memory, a row every few hundred bytes (the other heads' rows lie
// between), so the loads would otherwise wait on memory one cell at a time.
template <class R>
void prefetch_block(const AttentionTask &t, int64_t c0) {
    const int64_t end = std::min<int64_t>(c0 + kCellBlock, t.n_kv);
    const int64_t k_bytes = R::bytes(t.dk), v_bytes = R::bytes(t.dv);
    for (int64_t c = c0; c < end; c++) {
        for (int64_t b = 0; b < k_bytes; b += 64) __builtin_prefetch(t.k + c * t.k_stride + b);
        for (int64_t b = 0; b < v_bytes; b += 64) __builtin_prefetch(t.v + c * t.v_stride + b);
    }
}

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// The live cells of block c0 for row r: inside the view, mask not -inf.
template <class P>
uint32_t live_bits(const AttentionTask &t, int r, int64_t c0) {
    const int64_t in_view = std::min<int64_t>(kCellBlock, t.n_kv - c0);
    const uint32_t view_bits = in_view == kCellBlock ? 0xFFFFu : (1u << in_view) - 1;
    if (t.mask[r] == nullptr) return view_bits;
    if (in_view == kCellBlock) return P::unmasked(t.mask[r] + c0);
    uint32_t bits = 0;
    for (int64_t c = 0; c < in_view; c++) bits |= (uint32_t)(t.mask[r][c0 + c] != kMaskedBits) << c;
    return bits;
}

// The mask values of block c0 for row r as floats (0 past the view: those lanes are dead).
template <class P>
typename P::F mask_values(const AttentionTask &t, int r, int64_t c0) {
    if (t.mask[r] == nullptr) return P::zero();
    if (c0 + kCellBlock <= t.n_kv) return P::load_f16(t.mask[r] + c0);
    alignas(64) uint16_t tail[kCellBlock] = {};
    std::copy(t.mask[r] + c0, t.mask[r] + t.n_kv, tail);
    return P::load_f16(tail);
}

// A head's sixteen-value chunks: NJ when the body was instantiated for the head size (its loops
// then have constant bounds, unrolled without a test a chunk), else the task's.
template <int NJ>
inline int64_t chunks(int64_t head_size) {
    if constexpr (NJ > 0) return NJ;
    return head_size / kCellBlock;
}

// Whether the pack sums sixteen packs at once (sums16: lane c of the result is sum16 of pack c,
// the same tree, so the same bits), which the AVX-512 pack does in 15 adds where sixteen sum16
// take 64 and the shuffles between (the AVX2 pack in 30 adds where they take 64).
template <class P, class = void>
struct HasSums16 : std::false_type {};
template <class P>
struct HasSums16<P, std::void_t<decltype(P::sums16(static_cast<const typename P::F *>(nullptr)))>>
    : std::true_type {};

// block_dots (below) for a pack with sums16: each row's sixteen cells' lanes kept, then summed
// at once. A cell no row sees gets zeros (its lane is thrown away); a cell some rows do not see
// is computed for them too, and their select drops it. (The chain is block_dots' spelled again:
// a helper both call, taking the converted K row by pointer, made this body 1.2x slower.)
template <class P, class R, int NJ>
void block_dots_sixteen(const AttentionTask &t, int64_t c0, const float (*q)[kMaxHeadSize], uint32_t any,
                        float (*dots)[kCellBlock]) {
    using F = typename P::F;
    F k[kMaxHeadSize / kCellBlock];
    alignas(64) F a[kMaxTaskRows][kCellBlock];
    const int64_t nj = chunks<NJ>(t.dk);
    for (int c = 0; c < kCellBlock; c++) {
        if (!(any >> c & 1)) {  // outside the view or masked for every row: a lane thrown away
            for (int r = 0; r < t.n_rows; r++) a[r][c] = P::zero();
            continue;
        }
        const char *row = t.k + (c0 + c) * t.k_stride;
        for (int64_t j = 0; j < nj; j++) k[j] = R::load(row, j * kCellBlock);
        for (int r = 0; r < t.n_rows; r++) {
            F x = P::mul(k[0], P::load(q[r]));
            for (int64_t j = 1; j < nj; j++) x = P::fma(k[j], P::load(q[r] + j * kCellBlock), x);
            a[r][c] = x;
        }
    }
    for (int r = 0; r < t.n_rows; r++) P::store(dots[r], P::sums16(a[r]));
}

// The block's dot products, dots[r][c] for the cells row r sees: each K row converted once,
// into registers, for every row of the task.
template <class P, class R, int NJ>
void block_dots(const AttentionTask &t, int64_t c0, const float (*q)[kMaxHeadSize], const uint32_t *live,
                uint32_t any, float (*dots)[kCellBlock]) {
    using F = typename P::F;
    F k[kMaxHeadSize / kCellBlock];
    const int64_t nj = chunks<NJ>(t.dk);
    for (uint32_t bits = any; bits != 0; bits &= bits - 1) {
        const int c = __builtin_ctz(bits);
        const char *row = t.k + (c0 + c) * t.k_stride;
        for (int64_t j = 0; j < nj; j++) k[j] = R::load(row, j * kCellBlock);
        for (int r = 0; r < t.n_rows; r++) {
            if (!(live[r] >> c & 1)) continue;
            F a = P::mul(k[0], P::load(q[r]));
            for (int64_t j = 1; j < nj; j++) a = P::fma(k[j], P::load(q[r] + j * kCellBlock), a);
            dots[r][c] = P::sum16(a);
        }
    }
}

// The block's softmax step for the task's rows that see a cell of it: M, S and the accumulators
// rescaled, p (0 for dead cells). A row's scalar steps (attention.h) are lanes of packs here: the
// rescaling factors exp(M - M') of all rows are one exp16 (row r in lane r), and with sums16 the
// rows' sum16(p) one tree; each lane does the operations a row alone does, so the same bits.
template <class P, int NJ>
void block_softmax(const AttentionTask &t, int64_t c0, const uint32_t *live, const float (*dots)[kCellBlock],
                   float *M, float *S, float (*p)[kCellBlock]) {
    using F = typename P::F;
    static_assert(kMaxTaskRows <= kCellBlock, "a row a lane");
    alignas(64) float next[kCellBlock], ms[kCellBlock], sums[kCellBlock];
    for (int r = 0; r < kCellBlock; r++) next[r] = M[r];  // lanes of rows with no live cell: unused
    for (int r = 0; r < t.n_rows; r++) {
        if (live[r] == 0) continue;
        const F s = P::select(live[r], P::add(P::mul(P::load(dots[r]), P::set1(t.scale)), mask_values<P>(t, r, c0)),
                              P::set1(kMinusInf));
        next[r] = std::max(M[r], P::max16(s));
        const F prob = P::exp16(P::add(s, P::set1(-next[r])));
        P::store(p[r], prob);
        if constexpr (!HasSums16<P>::value) sums[r] = P::sum16(prob);
    }
    // M - M' as M + (-M'): IEEE subtraction is that addition, bit for bit
    P::store(ms, P::exp16(P::add(P::load(M), P::mul(P::load(next), P::set1(-1.0f)))));
    if constexpr (HasSums16<P>::value) {
        F probs[kCellBlock];
        for (int r = 0; r < kCellBlock; r++) probs[r] = r < t.n_rows && live[r] != 0 ? P::load(p[r]) : P::zero();
        P::store(sums, P::sums16(probs));
    }
    const int64_t nv = chunks<NJ>(t.dv);
    for (int r = 0; r < t.n_rows; r++) {
        if (live[r] == 0) continue;
        const float scale = M[r] == kMinusInf ? 0.0f : ms[r];
        S[r] = S[r] * scale + sums[r];
        if (scale != 1.0f) {  // x * 1 is x: skipping it changes no bit
            float *acc = t.acc + r * t.dv;
            for (int64_t j = 0; j < nv; j++)
                P::store(acc + j * kCellBlock, P::mul(P::load(acc + j * kCellBlock), P::set1(scale)));
        }
        M[r] = next[r];
    }
}

// A block's V rows converted to floats once, for tasks of many rows (a prompt's): each row then
// reads them from L1 instead of converting every V row again for each pair of rows.
template <class P>
struct F32Rows {
    static typename P::F load(const char *row, int64_t j) { return P::load((const float *)row + j); }
};

// Rows a value pass holds in registers: the pack's kValueRows (with kValueChunks chunks each),
// else two.
template <class P, class = void>
struct ValueRows : std::integral_constant<int, 2> {};
template <class P>
struct ValueRows<P, std::void_t<decltype(P::kValueRows)>> : std::integral_constant<int, P::kValueRows> {};

// acc[r] += p[r][c] v[c] over the live cells of rows r0 .. r0 + NR - 1, cells in order, for NJ
// sixteen-value chunks of the row from value j: NR x NJ accumulators held in registers, enough
// independent multiply-add chains to hide their latency. Cell c's V row is at v + c * v_stride.
template <class P, class R, int NR, int NJ>
void accumulate(const AttentionTask &t, const char *v, size_t v_stride, int64_t j, int r0, const uint32_t *live,
                const float (*p)[kCellBlock]) {
    using F = typename P::F;
    F a[NR][NJ];
#pragma GCC unroll 8
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
        for (int q = 0; q < NJ; q++) a[i][q] = P::load(t.acc + (r0 + i) * t.dv + j + q * kCellBlock);
    uint32_t all = live[r0], either = live[r0];
    for (int i = 1; i < NR; i++) {
        all &= live[r0 + i];
        either |= live[r0 + i];
    }
    for (uint32_t bits = either; bits != 0; bits &= bits - 1) {
        const int c = __builtin_ctz(bits);
        const char *row = v + c * v_stride;
        F vc[NJ];
#pragma GCC unroll 8
        for (int q = 0; q < NJ; q++) vc[q] = R::load(row, j + q * kCellBlock);
        if (NR == 1 || (all >> c & 1)) {  // every row sees the cell: the common case
#pragma GCC unroll 8
            for (int i = 0; i < NR; i++) {
                const F pc = P::set1(p[r0 + i][c]);
#pragma GCC unroll 8
                for (int q = 0; q < NJ; q++) a[i][q] = P::fma(pc, vc[q], a[i][q]);
            }
        } else {
#pragma GCC unroll 8
            for (int i = 0; i < NR; i++) {
                if (!(live[r0 + i] >> c & 1)) continue;
                const F pc = P::set1(p[r0 + i][c]);
#pragma GCC unroll 8
                for (int q = 0; q < NJ; q++) a[i][q] = P::fma(pc, vc[q], a[i][q]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
        for (int q = 0; q < NJ; q++) P::store(t.acc + (r0 + i) * t.dv + j + q * kCellBlock, a[i][q]);
}

template <class P, class R, int NR, int NJ>
void accumulate_rows(const AttentionTask &t, const char *v, size_t v_stride, int r0, const uint32_t *live,
                     const float (*p)[kCellBlock]) {
    constexpr int kChunks = P::kValueChunks;
    const int64_t dv = chunks<NJ>(t.dv) * kCellBlock;
    int64_t j = 0;
    for (; j + kChunks * kCellBlock <= dv; j += kChunks * kCellBlock)
        accumulate<P, R, NR, kChunks>(t, v, v_stride, j, r0, live, p);
    for (; j < dv; j += kCellBlock) accumulate<P, R, NR, 1>(t, v, v_stride, j, r0, live, p);
}

// Rows from which a task converts a block's V rows once (F32Rows): below, the pairs convert
// them as they go, which costs less than the stores and loads of the conversion (a 16-stream
// decode node, three rows a task, took up to 1.4x as long converting; Zen 5).
constexpr int kConvertValuesFrom = 4;

template <class P, class R, int NJ>
void block_values(const AttentionTask &t, int64_t c0, const uint32_t *live, uint32_t any,
                  const float (*p)[kCellBlock]) {
    const char *v = t.v + c0 * t.v_stride;
    int r = 0;
    if (t.n_rows >= kConvertValuesFrom) {
        constexpr int NR = ValueRows<P>::value;
        alignas(64) float values[kCellBlock][kMaxHeadSize];
        const int64_t nv = chunks<NJ>(t.dv);
        for (uint32_t bits = any; bits != 0; bits &= bits - 1) {
            const int c = __builtin_ctz(bits);
            for (int64_t j = 0; j < nv; j++)
                P::store(values[c] + j * kCellBlock, R::load(v + c * t.v_stride, j * kCellBlock));
        }
        const char *converted = (const char *)values;
        for (; r + NR <= t.n_rows; r += NR)
            accumulate_rows<P, F32Rows<P>, NR, NJ>(t, converted, sizeof values[0], r, live, p);
        for (; r + 2 <= t.n_rows; r += 2)
            accumulate_rows<P, F32Rows<P>, 2, NJ>(t, converted, sizeof values[0], r, live, p);
        if (r < t.n_rows) accumulate_rows<P, F32Rows<P>, 1, NJ>(t, converted, sizeof values[0], r, live, p);
        return;
    }
    for (; r + 2 <= t.n_rows; r += 2) accumulate_rows<P, R, 2, NJ>(t, v, t.v_stride, r, live, p);
    if (r < t.n_rows) accumulate_rows<P, R, 1, NJ>(t, v, t.v_stride, r, live, p);
}

// NJ: the head size in sixteen-value chunks when the body is instantiated for it (K and V
// alike), 0 for any (chunks()).
template <class P, class R, int NJ>
void attend_rows(const AttentionTask &t) {
    alignas(64) float M[kCellBlock], S[kMaxTaskRows];
    alignas(64) float p[kMaxTaskRows][kCellBlock];
    alignas(64) float dots[kMaxTaskRows][kCellBlock] = {};  // a dead cell's lane is thrown away (select)
    alignas(64) float q[kMaxTaskRows][kMaxHeadSize];
    uint32_t live[kMaxTaskRows];
    for (int r = 0; r < t.n_rows; r++)
        for (int64_t d = 0; d < t.dk; d += kCellBlock) P::store(q[r] + d, P::round_f16(P::load(t.q[r] + d)));
    std::fill(M, M + kCellBlock, kMinusInf);
    for (int r = 0; r < t.n_rows; r++) {
        S[r] = 0.0f;
        std::fill(t.acc + r * t.dv, t.acc + (r + 1) * t.dv, 0.0f);
    }
    for (int64_t c0 = 0; c0 < t.n_kv; c0 += kCellBlock) {
        uint32_t any = 0;
        for (int r = 0; r < t.n_rows; r++) any |= live[r] = live_bits<P>(t, r, c0);
        if (any == 0) continue;
        prefetch_block<R>(t, c0 + kCellBlock);
        if constexpr (HasSums16<P>::value) block_dots_sixteen<P, R, NJ>(t, c0, q, any, dots);
        else block_dots<P, R, NJ>(t, c0, q, live, any, dots);
        block_softmax<P, NJ>(t, c0, live, dots, M, S, p);
        block_values<P, R, NJ>(t, c0, live, any, p);
    }
    for (int r = 0; r < t.n_rows; r++) {
        const float inv = S[r] == 0.0f ? 0.0f : 1.0f / S[r];
        const float *acc = t.acc + r * t.dv;
        for (int64_t e = 0; e < t.dv; e += kCellBlock) P::store(t.out[r] + e, P::mul(P::load(acc + e), P::set1(inv)));
    }
}

// SmolLM2's heads (64) and the common 128 get bodies of their own.
template <class P, class R>
void attend_rows(const AttentionTask &t) {
    if (t.dk == t.dv && t.dk == 64) return attend_rows<P, R, 4>(t);
    if (t.dk == t.dv && t.dk == 128) return attend_rows<P, R, 8>(t);
    attend_rows<P, R, 0>(t);
}

template <class P>
void attend(const AttentionTask &t) {
    if (t.kv_type == GGML_TYPE_Q8_0) return attend_rows<P, Q8Rows<P>>(t);
    attend_rows<P, F16Rows<P>>(t);
}

}  // namespace stackd::attention_body
