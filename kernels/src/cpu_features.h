// Which SIMD path this CPU can run, read at run time (the build never assumes): CPUID on x86,
// the kernel's hardware capabilities (getauxval) on aarch64.
#pragma once

namespace stackd {

// The numbers are the library's path numbers (api.cpp, server/engine/accel.py's PATHS): x86's
// first, as they were, then aarch64's. A build for one architecture compiles the other's
// bodies not at all; cpu_supports answers no for them.
enum class Path : int { Scalar = 0, Avx2 = 1, Avx512 = 2, NeonDot = 3, NeonI8mm = 4 };
constexpr int kPathCount = 5;

const char *path_name(Path path);
bool cpu_supports(Path path);
Path best_path();

}  // namespace stackd
