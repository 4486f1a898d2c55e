#include "huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>

namespace stackd {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

size_t round_up(size_t n) { return (n + kHugePage - 1) / kHugePage * kHugePage; }

std::mutex g_advised_mutex;
std::set<std::pair<uintptr_t, size_t>> g_advised;

}  // namespace

void *alloc_huge_aligned(size_t size) { return std::aligned_alloc(kHugePage, round_up(size == 0 ? 1 : size)); }

void advise_huge(const void *base, size_t size) {
    const auto begin = (uintptr_t)base;
    {
        std::lock_guard<std::mutex> lock(g_advised_mutex);
        if (!g_advised.insert({begin, size}).second) return;
    }
    const uintptr_t first = round_up(begin), last = (begin + size) / kHugePage * kHugePage;
    if (last <= first) return;
    madvise((void *)first, last - first, MADV_HUGEPAGE);
}

}  // namespace stackd
