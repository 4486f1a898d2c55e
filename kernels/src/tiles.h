// The one tile driver every path runs (scalar, AVX2, AVX-512; Q4_1 and Q8_0): the walk over a
// thread's row groups and the call's tokens in tiles, the loop over K-blocks with its weight
// prefetch, and the stores. A path gives only its body, the arithmetic of one K-block for one
// tile (the dot products; kernels.h states what every body computes).
//
// Include after the file's `#pragma GCC target` line: the driver is compiled for the target of
// the body it runs, and inlines it. Every function here is a template over the body, a type of
// the including file's anonymous namespace, so each file gets its own copies for its own
// target (nothing for the linker to merge across targets). What the driver calls that does not
// depend on the body (store_group, prefetch_ahead) comes from kernels.h and prefetch.h, which
// the files include before their pragma: one baseline definition for all.
//
// A body (struct Body) has:
//   using Block                the repacked weight block (Q4x8Block, Q8x8Block, Q4Kx8Block, ...)
//   using Act (optional)       the activation block (ActBlock unless given: ActKBlock for K-quants)
//   kTile                      tokens per tile at most (then 4, 2 and 1 for the rest)
//   kPairsFrom                 from this many tokens a tile takes two row groups side by side
//                              (NG = 2, 16 rows), else one (NG = 1); 0: always one
//   Acc<TT, NG>                a tile's accumulators, TT tokens x 8 NG rows of floats in that
//                              order (an array of vectors: zeroed by {} and stored by memcpy)
//   add_block<TT, NG>(acc, w, nb, act, i)
//                              adds K-block b of NG groups (group j's block at w + j*nb) times
//                              TT tokens (token k's block at act[i + k*nb], i = t*nb + b) into acc
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels.h"
#include "prefetch.h"

// A body's add_block runs inside the driver's loop over blocks: inlined, its accumulators stay
// in registers across the loop.
#define STACKD_BODY_INLINE inline __attribute__((always_inline))

// Integer sums are exact in any order, so GCC may reassociate a body's chain of vector adds into
// a tree and compute every step's products first: on AVX2, with four tokens a tile, that was 32
// live vectors for the 16 registers, spilled and reloaded every block, and the products ran at
// two thirds of their speed. An empty asm on the running sum after each add keeps the chain a
// chain: no instruction, the source's order.
#if defined(__x86_64__)
#define STACKD_KEEP_CHAIN(v) __asm__("" : "+x"(v))
#else
#define STACKD_KEEP_CHAIN(v) __asm__("" : "+w"(v))
#endif

namespace stackd {
namespace tiles {

// A body's activation block: Body::Act, or ActBlock for the bodies that name none.
template <class Body, class = void> struct ActOf { using type = ActBlock; };
template <class Body> struct ActOf<Body, std::void_t<typename Body::Act>> { using type = typename Body::Act; };
template <class Body> using Act = typename ActOf<Body>::type;

// Calls body(std::integral_constant<int, TT>, first_token) over n tokens in tiles of kTile,
// then of 4, 2 and 1 (those not above kTile): a token's arithmetic is the same in any tile
// (kernels.h).
template <int kTile, class Body>
inline void for_tiles(int64_t n, Body body) {
    int64_t t = 0;
    for (; t + kTile <= n; t += kTile) body(std::integral_constant<int, kTile>{}, t);
    if constexpr (kTile > 4) {
        for (; t + 4 <= n; t += 4) body(std::integral_constant<int, 4>{}, t);
    }
    if constexpr (kTile > 2) {
        for (; t + 2 <= n; t += 2) body(std::integral_constant<int, 2>{}, t);
    }
    if constexpr (kTile > 1) {
        for (; t < n; t++) body(std::integral_constant<int, 1>{}, t);
    }
}

// NG row groups from wg (contiguous, nb blocks each) against TT tokens from t, over all K-blocks:
// out receives TT x 8 NG floats, token by token.
template <int TT, int NG, class Body>
inline void tile(const Body &body, const typename Body::Block *wg, int64_t nb, const Act<Body> *act,
                 int64_t t, float *out) {
    typename Body::template Acc<TT, NG> acc{};
    for (int64_t b = 0; b < nb; b++) {
        for (int j = 0; j < NG; j++) prefetch_ahead(wg + j * nb, nb, b);
        body.template add_block<TT, NG>(acc, wg + b, nb, act, t * nb + b);
    }
    static_assert(sizeof acc == sizeof(float) * TT * NG * kRowsPerGroup, "Acc: TT x 8 NG floats");
    std::memcpy(out, &acc, sizeof acc);
}

// The chunked form (kernels.h, GemmOut::chunk): K-blocks in chains of `chunk`, each chain added
// in float from zero exactly as `tile` adds all of K, the chains' sums added in double in order.
// sum receives TT x 8 NG doubles, token by token.
template <int TT, int NG, class Body>
inline void tile_chunked(const Body &body, const typename Body::Block *wg, int64_t nb, const Act<Body> *act,
                         int64_t t, int64_t chunk, double *sum) {
    constexpr int kN = TT * NG * kRowsPerGroup;
    for (int i = 0; i < kN; i++) sum[i] = 0.0;
    for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
        typename Body::template Acc<TT, NG> acc{};
        const int64_t b1 = b0 + chunk < nb ? b0 + chunk : nb;
        for (int64_t b = b0; b < b1; b++) {
            for (int j = 0; j < NG; j++) prefetch_ahead(wg + j * nb, nb, b);
            body.template add_block<TT, NG>(acc, wg + b, nb, act, t * nb + b);
        }
        alignas(64) float part[kN];
        static_assert(sizeof acc == sizeof part, "Acc: TT x 8 NG floats");
        std::memcpy(part, &acc, sizeof acc);
        for (int i = 0; i < kN; i++) sum[i] += (double)part[i];
    }
}

// Row groups g .. g+NG-1 against all n_tokens tokens, tile by tile, into their rows of out.
template <int NG, class Body>
inline void group_tiles(const Body &body, const typename Body::Block *w, int64_t nb, int64_t rows,
                        int64_t g, const Act<Body> *act, int64_t n_tokens, const GemmOut &out) {
    for_tiles<Body::kTile>(n_tokens, [&](auto size, int64_t t) {
        constexpr int TT = decltype(size)::value;
        constexpr int kN = TT * NG * kRowsPerGroup;
        alignas(64) float result[kN];
        if (out.chunk <= 0) {
            tile<TT, NG>(body, w + g * nb, nb, act, t, result);
        } else {
            alignas(64) double sum[kN];
            tile_chunked<TT, NG>(body, w + g * nb, nb, act, t, out.chunk, sum);
            for (int i = 0; i < kN; i++) result[i] = (float)sum[i];
            if (out.f64 != nullptr) {
                for (int i = 0; i < TT; i++)
                    for (int j = 0; j < NG; j++)
                        store_group(out.f64 + (t + i) * out.stride, sum + (i * NG + j) * kRowsPerGroup,
                                    (g + j) * kRowsPerGroup, rows);
            }
        }
        for (int i = 0; i < TT; i++)
            for (int j = 0; j < NG; j++)
                store_group(out.f32 + (t + i) * out.stride, result + (i * NG + j) * kRowsPerGroup,
                            (g + j) * kRowsPerGroup, rows);
    });
}

// The product with the given body (kernels.h's GemmFn): row groups [g_begin, g_end), two at a
// time from Body::kPairsFrom tokens (an odd last one alone), else one at a time.
template <class Body>
inline void gemm(const Body &body, const typename Body::Block *w, int64_t nb, int64_t rows,
                 int64_t g_begin, int64_t g_end, const Act<Body> *act, int64_t n_tokens, const GemmOut &out) {
    int64_t g = g_begin;
    if constexpr (Body::kPairsFrom > 0) {
        if (n_tokens >= Body::kPairsFrom)
            for (; g + 2 <= g_end; g += 2) group_tiles<2>(body, w, nb, rows, g, act, n_tokens, out);
    }
    for (; g < g_end; g++) group_tiles<1>(body, w, nb, rows, g, act, n_tokens, out);
}

// A path's kernel (kernels.h's GemmFn) for a body that needs nothing from the call.
template <class Body>
void run(const typename Body::Block *w, int64_t nb, int64_t rows, int64_t g_begin, int64_t g_end,
         const Act<Body> *act, int64_t n_tokens, const GemmOut &out) {
    gemm(Body{}, w, nb, rows, g_begin, g_end, act, n_tokens, out);
}

}  // namespace tiles
}  // namespace stackd
