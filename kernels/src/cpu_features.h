// Which SIMD path this CPU can run, read with CPUID at run time (the build never assumes).
#pragma once

namespace stackd {

enum class Path : int { Scalar = 0, Avx2 = 1, Avx512 = 2 };
constexpr int kPathCount = 3;

const char *path_name(Path path);
bool cpu_supports(Path path);
Path best_path();

}  // namespace stackd
