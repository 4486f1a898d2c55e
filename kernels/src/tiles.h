// How the SIMD paths walk the tokens of a call: tiles of kTile tokens, then of 4, 2 and 1.
// Include after the file's `#pragma GCC target` line (the tiles it calls are that target's).
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

}  // namespace tiles
}  // namespace stackd
