// Memory on huge pages where the kernel allows it (transparent huge pages, madvise mode): 2 MiB
// on x86-64, and on aarch64 whatever its base page makes them (huge_pages.cpp asks the system).
//
// A decode step streams every weight once and reads every stream's KV cache once, a row every
// few hundred bytes. On 4 KiB pages that is a TLB miss every page, and the hardware prefetchers
// stop at each page's end. ggml allocates with malloc (4 KiB pages), as does llama.cpp's KV cache.
// On this Linux's default (THP in madvise mode) nothing gets huge pages unless asked. Asking
// before the memory is touched makes every first touch fault a whole zeroed 2 MiB page: that
// cost our start-up 0.15 s (bench/startup.py, first answer 0.65-0.71 s against 0.80-0.86 s).
// So our weight buffers are only aligned to huge pages when allocated, and, with llama.cpp's
// KV cache when it is committed at load (engine.kv_commit = eager; a lazy one stays on small
// pages, lazy_commit.h), marked when a graph first uses them; the kernel's khugepaged
// collapses them in the background. Weights faulted as huge pages from the start decode faster,
// and a collapse (MADV_COLLAPSE) on a thread of its own at the first graph got most of that back
// but slowed the first answer past llama-server's on two cores (bench/README.md, "Measurements
// behind design choices"). khugepaged's pace
// (16 MB every 10 s by default) is the price of a quick start.
#pragma once

#include <cstddef>

namespace stackd {

// size bytes (rounded up to whole huge pages), aligned to one, so that advise_huge can later
// mark all of it; std::free releases it. Null if the allocation fails.
void *alloc_huge_aligned(size_t size);

// Marks the whole huge pages inside [base, base + size), memory already touched (our weights,
// llama.cpp's KV cache), for huge pages: khugepaged collapses them in the background (no
// MADV_COLLAPSE: copying them at once would stall the step that asked). Once per range; a
// kernel that refuses leaves it as it was.
void advise_huge(const void *base, size_t size);

}  // namespace stackd
