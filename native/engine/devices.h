// Where a model's layers live: this CPU alone, or ggml RPC devices (other nodes' memory,
// reached through ggml's RPC backend) split by layers or by tensors. Also the RPC server a
// node runs for a leader that places layers on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

struct placement_params {
    std::vector<std::string> rpc_endpoints;   // "host:port" of each RPC server, in device order
    int32_t            split_mode = LLAMA_SPLIT_MODE_LAYER;   // LAYER or TENSOR
    std::vector<float> tensor_split;          // one share per endpoint (layers or rows)
    int32_t            n_gpu_layers = 0;      // llama.cpp's count: the last layers (and the
                                              // output) go to the RPC devices, the rest stay here
};

// The device list and split array llama_model_params points at, kept alive for the load.
class model_devices {
public:
    // Registers each endpoint with ggml's RPC backend (which connects to it: the caller has
    // checked that it answers, since an unreachable endpoint aborts the process).
    explicit model_devices(const placement_params & placement);

    void apply(llama_model_params & mp);

private:
    placement_params          placement_;
    std::vector<ggml_backend_dev_t> devices_;   // null-terminated
    std::vector<float>        split_;           // llama_max_devices() long
};

// Serve `device` (a ggml_backend_dev_t's address: our kernels' served device, see
// kernels/README.md; 0: this CPU) to one RPC client at a time on `endpoint` (127.0.0.1:port);
// never returns unless the server cannot start (then throws).
void rpc_serve(const std::string & endpoint, const std::string & cache_dir, int32_t n_threads,
               uintptr_t device = 0);
