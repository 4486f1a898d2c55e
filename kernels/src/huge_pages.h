// Memory on 2 MiB pages where the kernel allows it (transparent huge pages, madvise mode).
//
// A decode step streams every weight once and reads every stream's KV cache once, a row every
// few hundred bytes. On 4 KiB pages that is a TLB miss every page, and the hardware prefetchers
// stop at each page's end. ggml allocates with malloc (4 KiB pages), as does llama.cpp's KV cache.
// On this Linux's default (THP in madvise mode) nothing gets huge pages unless asked: our weight
// buffers (repacked and served) are asked at allocation, the KV cache when attention first reads
// it. Measured (AMD EPYC Zen 4, Q4_K_M file, four interleaved runs each): decode 2-15 % faster
// at one stream and 3-20 % at 16.
#pragma once

#include <cstddef>

namespace stackd {

// size bytes (rounded up to whole huge pages), aligned to one, asked to be backed by huge pages
// before anything touches them; std::free releases it. Null if the allocation fails.
void *alloc_huge(size_t size);

// Marks the whole huge pages inside [base, base + size), memory someone else allocated and
// already touched (llama.cpp's KV cache, cleared when made), for huge pages: the kernel's
// khugepaged collapses them in the background (no MADV_COLLAPSE: copying a large cache at once
// would stall the step that asked). Once per range; a kernel that refuses leaves it as it was.
void advise_huge(const void *base, size_t size);

}  // namespace stackd
