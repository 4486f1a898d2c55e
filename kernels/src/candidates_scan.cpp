#include "candidates_scan.h"

namespace stackd {

int64_t above_scalar(const float *x, int64_t from, int64_t n, float floor) {
    for (int64_t i = from; i < n; i++) {
        if (x[i] > floor) return i;
    }
    return n;
}

AboveFn above_for(Path path) {
    switch (path) {
#if defined(__x86_64__) || defined(__i386__)
        case Path::Avx512: return above_avx512;
        case Path::Avx2: return above_avx2;
#elif defined(__aarch64__)
        case Path::NeonI8mm:
        case Path::NeonDot: return above_neon;
#endif
        default: break;
    }
    return above_scalar;
}

}  // namespace stackd
