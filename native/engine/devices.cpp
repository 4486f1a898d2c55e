#include "devices.h"

#include <algorithm>
#include <stdexcept>

#include "ggml-backend.h"

namespace {

// ggml's RPC backend is registered in libggml's registry (built with GGML_RPC); its entry
// points are reached through the registry, never through a second copy of the library.
ggml_backend_reg_t rpc_registry() {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (reg == nullptr) {
        throw std::runtime_error("this llama.cpp build has no RPC backend");
    }
    return reg;
}

template <typename Fn>
Fn rpc_function(const char * name) {
    auto fn = (Fn) ggml_backend_reg_get_proc_address(rpc_registry(), name);
    if (fn == nullptr) {
        throw std::runtime_error(std::string("the RPC backend lacks ") + name);
    }
    return fn;
}

}  // namespace

model_devices::model_devices(const placement_params & placement) : placement_(placement) {
    if (placement_.rpc_endpoints.empty()) {
        return;
    }
    if (placement_.tensor_split.size() != placement_.rpc_endpoints.size()) {
        throw std::invalid_argument("one tensor_split share per RPC endpoint");
    }
    if (placement_.rpc_endpoints.size() > llama_max_devices()) {
        throw std::invalid_argument("too many RPC endpoints");
    }
    using add_server_fn = ggml_backend_reg_t (*)(const char *);
    auto add_server = rpc_function<add_server_fn>("ggml_backend_rpc_add_server");
    for (const std::string & endpoint : placement_.rpc_endpoints) {
        ggml_backend_reg_t reg = add_server(endpoint.c_str());
        if (reg == nullptr || ggml_backend_reg_dev_count(reg) == 0) {
            throw std::runtime_error("the RPC server at " + endpoint + " offers no device");
        }
        devices_.push_back(ggml_backend_reg_dev_get(reg, 0));   // one CPU per node
    }
    devices_.push_back(nullptr);
    split_.assign(llama_max_devices(), 0.0f);
    std::copy(placement_.tensor_split.begin(), placement_.tensor_split.end(), split_.begin());
}

void model_devices::apply(llama_model_params & mp) {
    if (devices_.empty()) {
        mp.n_gpu_layers = 0;
        return;
    }
    mp.devices = devices_.data();
    mp.split_mode = (llama_split_mode) placement_.split_mode;
    mp.tensor_split = split_.data();
    mp.n_gpu_layers = placement_.n_gpu_layers;
    mp.main_gpu = 0;
}

void rpc_serve(const std::string & endpoint, const std::string & cache_dir, int32_t n_threads,
               uintptr_t device) {
    using start_server_fn = void (*)(const char *, const char *, size_t, size_t, ggml_backend_dev_t *);
    auto start_server = rpc_function<start_server_fn>("ggml_backend_rpc_start_server");
    ggml_backend_dev_t served = device != 0 ? reinterpret_cast<ggml_backend_dev_t>(device)
                                            : ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (served == nullptr) {
        throw std::runtime_error("no CPU device");
    }
    start_server(endpoint.c_str(), cache_dir.empty() ? nullptr : cache_dir.c_str(),
                 (size_t) std::max(1, n_threads), 1, &served);
    throw std::runtime_error("the RPC server on " + endpoint + " could not start");
}
