#include "cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace stackd {

namespace {

struct Features {
    bool avx2 = false;      // AVX2 + FMA + F16C, with the OS saving YMM state
    bool avx512 = false;    // AVX-512 F/BW/VL + VNNI, with the OS saving ZMM state
    bool neon_dot = false;  // Advanced SIMD with the dot products (sdot/udot: FEAT_DotProd)
    bool neon_i8mm = false; // and the int8 matrix multiplies (smmla: FEAT_I8MM)
};

#if defined(__x86_64__) || defined(__i386__)
unsigned long long xgetbv0() {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

Features detect() {
    Features f;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
               f16c = c & (1u << 29);
    if (!(osxsave && avx)) return f;
    const unsigned long long xcr0 = xgetbv0();
    const bool ymm_state = (xcr0 & 0x6) == 0x6;
    const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512bw = b & (1u << 30),
               avx512vl = b & (1u << 31), avx512vnni = c & (1u << 11);
    f.avx2 = ymm_state && avx2 && fma && f16c;
    f.avx512 = f.avx2 && zmm_state && avx512f && avx512bw && avx512vl && avx512vnni;
    return f;
}
#elif defined(__aarch64__) && defined(__linux__)
// The kernel's bits (arch/arm64/include/uapi/asm/hwcap.h), spelled here so that an older
// libc's headers still build: the kernel sets them from the ID registers it trusts, which is
// what user space may rely on (an EL0 read of ID_AA64ISAR0 is trapped and emulated anyway).
constexpr unsigned long kHwcapAsimd = 1ul << 1;
constexpr unsigned long kHwcapAsimdDp = 1ul << 20;   // HWCAP_ASIMDDP: sdot, udot
constexpr unsigned long kHwcap2I8mm = 1ul << 13;     // HWCAP2_I8MM: smmla, ummla, usmmla

Features detect() {
    Features f;
    const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
    // Advanced SIMD's fp16 <-> fp32 conversions and fused multiply-adds are ARMv8.0's: the
    // dot products are the only extension the dotprod path needs.
    f.neon_dot = (hwcap & kHwcapAsimd) && (hwcap & kHwcapAsimdDp);
    f.neon_i8mm = f.neon_dot && (hwcap2 & kHwcap2I8mm);
    return f;
}
#else
Features detect() { return {}; }
#endif

const Features &features() {
    static const Features f = detect();
    return f;
}

}  // namespace

const char *path_name(Path path) {
    switch (path) {
        case Path::Scalar: return "scalar";
        case Path::Avx2: return "avx2";
        case Path::Avx512: return "avx512-vnni";
        case Path::NeonDot: return "neon-dotprod";
        case Path::NeonI8mm: return "neon-i8mm";
    }
    return "?";
}

bool cpu_supports(Path path) {
    switch (path) {
        case Path::Scalar: return true;
        case Path::Avx2: return features().avx2;
        case Path::Avx512: return features().avx512;
        case Path::NeonDot: return features().neon_dot;
        case Path::NeonI8mm: return features().neon_i8mm;
    }
    return false;
}

// A CPU with none of the SIMD paths gets Scalar, which `engine.kernels = auto` takes as "keep
// ggml's kernels" (an x86 CPU without AVX2, an aarch64 one without the dot products).
Path best_path() {
    if (cpu_supports(Path::Avx512)) return Path::Avx512;
    if (cpu_supports(Path::Avx2)) return Path::Avx2;
    if (cpu_supports(Path::NeonI8mm)) return Path::NeonI8mm;
    if (cpu_supports(Path::NeonDot)) return Path::NeonDot;
    return Path::Scalar;
}

}  // namespace stackd
