// The portable build's CPU backend, loaded when our native code is (linked into _engine and
// libstackd_kernels by CMakeLists.txt).
//
// `make wheels` builds llama-cpp-python as llama.cpp's releases are built: every ggml backend a
// module (GGML_BACKEND_DL), the CPU one once per CPU generation (GGML_CPU_ALL_VARIANTS:
// libggml-cpu-haswell.so, -skylakex.so, ...), each scoring the CPU it runs on. llama.cpp loads
// the best one in llama_backend_init(), but looks for them only beside the executable (python's
// bin/) and in the working directory, not beside libggml.so in llama_cpp/lib/ where the wheel
// puts them; and our kernels ask ggml for its CPU device before any model load. So when this
// module is loaded into a process whose ggml has no backend yet and whose libggml.so has CPU
// variants beside it, ggml loads the best of them (and the RPC backend) from there, first.
// A build with the CPU backend linked in (make setup's) has it registered already: nothing
// happens.
#include <dlfcn.h>

#include <filesystem>
#include <string>

#include "ggml-backend.h"

namespace {

bool has_cpu_variants(const std::filesystem::path &dir) {
    std::error_code ec;
    for (const auto &entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("libggml-cpu-", 0) == 0 && entry.path().extension() == ".so") return true;
    }
    return false;
}

__attribute__((constructor)) void load_ggml_backends() {
    if (ggml_backend_reg_count() > 0) return;
    Dl_info info;
    if (!dladdr(reinterpret_cast<void *>(&ggml_backend_load_all_from_path), &info) || !info.dli_fname) return;
    const std::filesystem::path dir = std::filesystem::path(info.dli_fname).parent_path();
    if (has_cpu_variants(dir)) ggml_backend_load_all_from_path(dir.c_str());
}

}  // namespace
