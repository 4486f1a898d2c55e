#include "lazy_commit.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <mutex>

#include "ggml-backend-impl.h"

namespace stackd {

namespace {

using alloc_fn = ggml_backend_buffer_t (*)(ggml_backend_buffer_type_t, size_t);
using clear_fn = void (*)(ggml_backend_buffer_t, uint8_t);

// Below this many whole pages a memset costs less than the system call and the faults after it.
constexpr uintptr_t kMinReleasePages = 16;

// Both set once, before the wrapper is installed (commit_cpu_buffers_on_write).
alloc_fn g_cpu_alloc = nullptr;   // ggml's own, wrapped by alloc_committing_on_write
clear_fn g_cpu_clear = nullptr;   // ggml's memset clear, read off a buffer of its own

void clear_by_release(ggml_backend_buffer_t buffer, uint8_t value) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t begin = (uintptr_t)buffer->context, end = begin + buffer->size;
    const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
    if (value != 0 || last < first + kMinReleasePages * page) {
        g_cpu_clear(buffer, value);
        return;
    }
    // The partial pages at the ends are shared with the allocator's neighbours: written, not released.
    std::memset((void *)begin, 0, first - begin);
    std::memset((void *)last, 0, end - last);
    if (madvise((void *)first, last - first, MADV_DONTNEED) != 0) {
        std::memset((void *)first, 0, last - first);   // not anonymous memory after all: clear it
    }
}

ggml_backend_buffer_t alloc_committing_on_write(ggml_backend_buffer_type_t buft, size_t size) {
    ggml_backend_buffer_t buffer = g_cpu_alloc(buft, size);
    if (buffer != nullptr && buffer->iface.clear == g_cpu_clear) buffer->iface.clear = clear_by_release;
    return buffer;
}

}  // namespace

void commit_cpu_buffers_on_write() {
    static std::once_flag once;
    std::call_once(once, [] {
        ggml_backend_buffer_type_t cpu = ggml_backend_cpu_buffer_type();
        g_cpu_alloc = cpu->iface.alloc_buffer;
        ggml_backend_buffer_t probe = g_cpu_alloc(cpu, 1);
        if (probe == nullptr) return;               // no memory now: buffers keep ggml's memset
        g_cpu_clear = probe->iface.clear;
        ggml_backend_buffer_free(probe);
        if (g_cpu_clear != nullptr) cpu->iface.alloc_buffer = alloc_committing_on_write;
    });
}

bool clears_by_release(const void *buffer) {
    return ((ggml_backend_buffer_t)buffer)->iface.clear == clear_by_release;
}

}  // namespace stackd
