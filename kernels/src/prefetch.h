// Software prefetch of repacked weight blocks, shared by every path and architecture: the
// compiler's builtin is x86's prefetcht0 and aarch64's prfm pldl1keep (any target).
#pragma once

#include <cstddef>
#include <cstdint>

namespace stackd {

// How many row groups ahead the tiles prefetch. At a few tokens the kernels stream the
// weights once, and the hardware prefetcher alone left a thread well under the bandwidth it
// can read (bench/README.md, "Measurements behind design choices").
constexpr int64_t kPrefetchGroupsAhead = 4;

// Asks for the cache lines of block b of the row group kPrefetchGroupsAhead groups after
// `group` (a group's nb blocks are contiguous, and so are the groups).
template <class Block>
inline void prefetch_ahead(const Block *group, int64_t nb, int64_t b) {
    // An address, not a pointer: past the last groups it points beyond the buffer, and a
    // prefetch there is a harmless hint.
    const uintptr_t p = reinterpret_cast<uintptr_t>(group) +
                        (uintptr_t)(kPrefetchGroupsAhead * nb + b) * sizeof(Block);
    // 64-byte steps: the cache line of x86 and of Arm's Cortex-A and Neoverse cores
    for (size_t offset = 0; offset < sizeof(Block); offset += 64)
        __builtin_prefetch(reinterpret_cast<const char *>(p + offset), 0, 3);
}

}  // namespace stackd
