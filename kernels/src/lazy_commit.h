// CPU buffers committed as they are written, not when they are cleared.
//
// llama.cpp clears a KV cache when it creates it ("to avoid NaNs in the padding") and again on
// llama_memory_clear(mem, true): ggml's CPU buffer clears with a memset of every byte. For a
// fresh cache that makes all of it resident before its first token: with the default chat
// model at 16 slots x 1,024 cells, 367 MB and ~0.2 s of page faults at every load, for slots
// that may never fill. ggml's CPU buffers are private anonymous memory (posix_memalign), where
// madvise(MADV_DONTNEED) is a clear as well: the pages go back to the kernel and read as zero
// when next touched. So, once installed, a CPU buffer cleared to zero releases its whole pages
// and memsets only the partial pages at its two ends; a cache is committed as its cells fill.
// What a buffer holds after a clear is the same either way; only when memory is taken moves.
#pragma once

namespace stackd {

// Has every CPU buffer allocated from now on in this process clear to zero by release
// (ggml_backend_cpu_buffer_type's alloc_buffer is wrapped). Once per process; buffers
// allocated before keep ggml's memset.
void commit_cpu_buffers_on_write();

// Whether a buffer of ggml's CPU type clears by release (a test's question).
bool clears_by_release(const void *buffer);

}  // namespace stackd
