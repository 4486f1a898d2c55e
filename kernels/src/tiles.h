// The one tile driver of every path and block type: how a call walks its row groups (one at a
// time, or two at a time where the path has 16-row tiles) and its tokens (tiles of kTile, then
// of 4, 2 and 1), and where a tile's results go. A path supplies only its tile: the arithmetic
// of TT tokens against one group (8 rows) or a pair of groups.
// Include after the file's `#pragma GCC target` line (the tiles it calls are that target's);
// every instantiation takes the including file's own lambdas, so none is shared between
// targets.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels.h"

namespace stackd {
namespace tiles {

// Calls body(std::integral_constant<int, TT>, first_token) over n tokens in tiles of kTile,
// then of 4, 2 and 1: a token's arithmetic is the same in any tile (kernels.h).
template <int kTile, class Body>
inline void for_tiles(int64_t n, Body body) {
    int64_t t = 0;
    for (; t + kTile <= n; t += kTile) body(std::integral_constant<int, kTile>{}, t);
    if constexpr (kTile > 4) {
        for (; t + 4 <= n; t += 4) body(std::integral_constant<int, 4>{}, t);
    }
    for (; t + 2 <= n; t += 2) body(std::integral_constant<int, 2>{}, t);
    for (; t < n; t++) body(std::integral_constant<int, 1>{}, t);
}

// Lambdas here and in the paths capture what they read by value: a reference capture makes the
// compiler reload it around every tile (4-5 % of the AVX-512 pair path at 16 tokens).
//
// Row group g (kGroups == 1) or groups g and g + 1 (kGroups == 2) against every token:
// tile(tt, t, out) fills out with tt tokens from t (std::integral_constant) x 8 x kGroups
// floats, token by token, each token's groups in order.
template <int kTile, int kGroups, class Tile>
inline void run_groups(int64_t g, int64_t rows, int64_t n_tokens, float *dst, int64_t dst_stride, Tile tile) {
    const int64_t row0 = g * kRowsPerGroup;
    for_tiles<kTile>(n_tokens, [&](auto tt, int64_t t) __attribute__((always_inline)) {
        constexpr int TT = decltype(tt)::value;
        alignas(64) float out[TT * 8 * kGroups];
        tile(tt, t, out);
        for (int i = 0; i < TT; i++) {
            float *row = dst + (t + i) * dst_stride;
            for (int k = 0; k < kGroups; k++)
                store_group(row, out + 8 * (kGroups * i + k), row0 + k * kRowsPerGroup, rows);
        }
    });
}

// Row groups [g_begin, g_end), one at a time.
template <int kTile, class Tile>
inline void for_groups(int64_t g_begin, int64_t g_end, int64_t rows, int64_t n_tokens, float *dst,
                       int64_t dst_stride, Tile tile) {
    for (int64_t g = g_begin; g < g_end; g++)
        run_groups<kTile, 1>(g, rows, n_tokens, dst, dst_stride, [&tile, g](auto tt, int64_t t, float *out) __attribute__((always_inline)) {
            tile(tt, g, t, out);
        });
}

// Row groups [g_begin, g_end): two at a time (pair: a 16-row tile of groups g and g + 1) from
// kPairsFrom tokens, else, and for an odd last group, one at a time (single). Below kPairsFrom
// tokens a step is bound by reading the weights, and a pair's two streams (its groups lie nb
// blocks apart) read DRAM at about 0.6x the rate of one group after another here (576 x
// 393216 at one token, two threads: 7.4 against 4.5-5.5 ms); from kPairsFrom tokens the
// arithmetic dominates and pairs win.
constexpr int64_t kPairsFrom = 4;

template <int kTile, class Pair, class Single>
inline void for_group_pairs(int64_t g_begin, int64_t g_end, int64_t rows, int64_t n_tokens, float *dst,
                            int64_t dst_stride, Pair pair, Single single) {
    int64_t g = g_begin;
    if (n_tokens >= kPairsFrom)
        for (; g + 2 <= g_end; g += 2)
            run_groups<kTile, 2>(g, rows, n_tokens, dst, dst_stride, [&pair, g](auto tt, int64_t t, float *out) __attribute__((always_inline)) {
                pair(tt, g, t, out);
            });
    for_groups<kTile>(g, g_end, rows, n_tokens, dst, dst_stride, single);
}

}  // namespace tiles
}  // namespace stackd
