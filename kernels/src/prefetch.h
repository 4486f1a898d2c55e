// Software prefetch of repacked weight blocks, shared by the SIMD paths (plain SSE: any target).
#pragma once

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

namespace stackd {

// Asks for a block's cache lines ahead of use. At a few tokens the kernels stream the weights
// once, and the hardware prefetcher alone left a thread well under the bandwidth it can read
// (9.5 against 20 GB/s here, one thread, one token): the tiles prefetch the same block a few
// row groups on (gemm_avx512.cpp, kAhead).
template <class Block>
inline void prefetch_block(const Block *base, int64_t index) {
    // An address, not a pointer: past the last groups it points beyond the buffer, and a
    // prefetch there is a harmless hint.
    const uintptr_t p = reinterpret_cast<uintptr_t>(base) + (uintptr_t)index * sizeof(Block);
    for (size_t offset = 0; offset < sizeof(Block); offset += 64)
        _mm_prefetch(reinterpret_cast<const char *>(p + offset), _MM_HINT_T0);
}

}  // namespace stackd
