#include "huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>

namespace stackd {

namespace {

// The size of a transparent huge page, from the system: 2 MiB on x86-64, and on aarch64 the
// level-2 block of its base page (2 MiB on 4 KiB pages, 32 MiB on 16 KiB, 512 MiB on 64 KiB).
// The kernel says it in hpage_pmd_size (Linux 4.13 on); otherwise it is a base page's worth of
// page-table entries (8 bytes each) times the page.
size_t detect_huge_page() {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = 0;
    if (FILE *f = std::fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r")) {
        unsigned long long v = 0;
        if (std::fscanf(f, "%llu", &v) == 1) size = (size_t)v;
        std::fclose(f);
    }
    // a power of two, a multiple of the page (what aligned_alloc and madvise need)
    if (size < page || (size & (size - 1)) != 0 || size % page != 0) size = page / 8 * page;
    return size;
}

size_t huge_page() {
    static const size_t size = detect_huge_page();
    return size;
}

size_t round_up(size_t n) { return (n + huge_page() - 1) / huge_page() * huge_page(); }

std::mutex g_advised_mutex;
std::set<std::pair<uintptr_t, size_t>> g_advised;

}  // namespace

void *alloc_huge_aligned(size_t size) { return std::aligned_alloc(huge_page(), round_up(size == 0 ? 1 : size)); }

void advise_huge(const void *base, size_t size) {
    const auto begin = (uintptr_t)base;
    {
        std::lock_guard<std::mutex> lock(g_advised_mutex);
        if (!g_advised.insert({begin, size}).second) return;
    }
    const uintptr_t first = round_up(begin), last = (begin + size) / huge_page() * huge_page();
    if (last <= first) return;
    madvise((void *)first, last - first, MADV_HUGEPAGE);
}

}  // namespace stackd
