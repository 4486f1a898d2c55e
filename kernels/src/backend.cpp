#include "backend.h"

#include <atomic>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "ggml-backend-impl.h"
#include "layout.h"
#include "matmul.h"

namespace stackd {

namespace {

std::atomic<int> g_path{(int)Path::Scalar};

// ---- buffer: weights only, repacked on the way in, unpacked on the way out ----

struct Allocation {
    void *data;
};

void buffer_free(ggml_backend_buffer_t buffer) {
    auto *alloc = static_cast<Allocation *>(buffer->context);
    std::free(alloc->data);
    delete alloc;
}

void *buffer_base(ggml_backend_buffer_t buffer) {
    return static_cast<Allocation *>(buffer->context)->data;
}

bool is_repacked(const ggml_tensor *t) { return t->type == GGML_TYPE_Q4_1; }

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21   // Linux 5.4; an older kernel refuses it and nothing changes
#endif

// llama.cpp hands us a weight straight from its mmap of the model file and keeps the mapping.
// Once repacked, those source pages are never read again (our copy serves every matmul), yet
// they stay resident and counted in the worker's memory: about the size of the Q4_1 weights
// twice over. MADV_PAGEOUT gives the whole pages inside the source back. It never changes
// contents (file pages are read again from the file if touched; anonymous pages with no swap
// are left as they are), so it is safe whatever `data` points into.
void release_source_pages(const void *data, size_t size) {
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) & ~(page - 1);
    if (end > begin) {
        madvise(reinterpret_cast<void *>(begin), end - begin, MADV_PAGEOUT);
    }
}

void buffer_set_tensor(ggml_backend_buffer_t, ggml_tensor *t, const void *data, size_t offset,
                       size_t size) {
    if (!is_repacked(t)) {
        std::memcpy(static_cast<char *>(t->data) + offset, data, size);
        return;
    }
    // Repacking needs whole rows of eight; llama.cpp loads a weight in one piece.
    GGML_ASSERT(offset == 0 && size == ggml_nbytes(t) && "stackd: Q4_1 weights load whole");
    repack_q4_1(data, t->ne[1], t->ne[0], static_cast<Q4x8Block *>(t->data));
    release_source_pages(data, size);
}

void buffer_get_tensor(ggml_backend_buffer_t, const ggml_tensor *t, void *data, size_t offset,
                       size_t size) {
    if (!is_repacked(t)) {
        std::memcpy(data, static_cast<const char *>(t->data) + offset, size);
        return;
    }
    GGML_ASSERT(offset == 0 && size == ggml_nbytes(t) && "stackd: Q4_1 weights read whole");
    unpack_q4_1(static_cast<const Q4x8Block *>(t->data), t->ne[1], t->ne[0], data);
}

void buffer_memset_tensor(ggml_backend_buffer_t, ggml_tensor *t, uint8_t value, size_t offset,
                          size_t size) {
    std::memset(static_cast<char *>(t->data) + offset, value, size);
}

void buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    std::memset(buffer_base(buffer), value, buffer->size);
}

const ggml_backend_buffer_i kBufferInterface = {
    /* .free_buffer   = */ buffer_free,
    /* .get_base      = */ buffer_base,
    /* .init_tensor   = */ nullptr,
    /* .memset_tensor = */ buffer_memset_tensor,
    /* .set_tensor    = */ buffer_set_tensor,
    /* .get_tensor    = */ buffer_get_tensor,
    /* .set_tensor_2d = */ nullptr,
    /* .get_tensor_2d = */ nullptr,
    /* .cpy_tensor    = */ nullptr,
    /* .clear         = */ buffer_clear,
    /* .reset         = */ nullptr,
};

constexpr size_t kAlignment = 64;

const char *buft_name(ggml_backend_buffer_type_t) { return "STACKD_Q4_1x8"; }

ggml_backend_buffer_t buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    void *data = std::aligned_alloc(kAlignment, (size + kAlignment - 1) / kAlignment * kAlignment);
    if (data == nullptr) return nullptr;
    return ggml_backend_buffer_init(buft, kBufferInterface, new Allocation{data}, size);
}

size_t buft_alignment(ggml_backend_buffer_type_t) { return kAlignment; }

size_t buft_alloc_size(ggml_backend_buffer_type_t, const ggml_tensor *t) {
    return is_repacked(t) ? repacked_size(t->ne[1], t->ne[0]) : ggml_nbytes(t);
}

// Not host memory in ggml's sense: the bytes are not in ggml's layout, so no other backend
// may read them in place (ggml_backend_buft_is_host is what the CPU backend checks).
bool buft_is_host(ggml_backend_buffer_type_t) { return false; }

// ---- backend: runs the MUL_MAT nodes the scheduler assigns to it ----

struct BackendContext {
    int n_threads;
    int fixed_path;  // -1: follow the process-wide path
    std::vector<ActBlock> scratch;
    std::vector<ggml_tensor *> nodes;
};

const char *backend_name(ggml_backend_t) { return "STACKD"; }

void backend_free(ggml_backend_t backend) {
    delete static_cast<BackendContext *>(backend->context);
    delete backend;
}

ggml_status backend_graph_compute(ggml_backend_t backend, ggml_cgraph *graph) {
    auto *ctx = static_cast<BackendContext *>(backend->context);
    const Path path = ctx->fixed_path >= 0 ? (Path)ctx->fixed_path : current_path();
    std::vector<ggml_tensor *> &nodes = ctx->nodes;
    nodes.clear();
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        ggml_tensor *node = ggml_graph_node(graph, i);
        if ((node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) continue;
        switch (node->op) {
            case GGML_OP_MUL_MAT: nodes.push_back(node); break;
            case GGML_OP_NONE:
            case GGML_OP_RESHAPE:
            case GGML_OP_VIEW:
            case GGML_OP_PERMUTE:
            case GGML_OP_TRANSPOSE: break;
            default: return GGML_STATUS_FAILED;
        }
    }
    if (!nodes.empty())
        mul_mat_nodes(nodes.data(), (int)nodes.size(), path, ctx->n_threads, ctx->scratch);
    return GGML_STATUS_SUCCESS;
}

const ggml_backend_i kBackendInterface = {
    /* .get_name            = */ backend_name,
    /* .free                = */ backend_free,
    /* .set_tensor_async    = */ nullptr,
    /* .get_tensor_async    = */ nullptr,
    /* .set_tensor_2d_async = */ nullptr,
    /* .get_tensor_2d_async = */ nullptr,
    /* .cpy_tensor_async    = */ nullptr,
    /* .synchronize         = */ nullptr,
    /* .graph_plan_create   = */ nullptr,
    /* .graph_plan_free     = */ nullptr,
    /* .graph_plan_update   = */ nullptr,
    /* .graph_plan_compute  = */ nullptr,
    /* .graph_compute       = */ backend_graph_compute,
    /* .event_record        = */ nullptr,
    /* .event_wait          = */ nullptr,
    /* .graph_optimize      = */ nullptr,
};

ggml_guid_t backend_guid() {
    static ggml_guid guid = {0x73, 0x74, 0x61, 0x63, 0x6b, 0x64, 0x2d, 0x71,
                             0x34, 0x5f, 0x31, 0x78, 0x38, 0x00, 0x00, 0x01};
    return &guid;
}

void backend_set_n_threads(ggml_backend_t backend, int n_threads) {
    static_cast<BackendContext *>(backend->context)->n_threads = n_threads > 0 ? n_threads : 1;
}

// ---- devices ----
// Two device objects share one interface but differ in get_buffer_type. The registered one
// answers with the repacking buffer type: llama.cpp's make_cpu_buft_list puts an ACCEL
// device's buffer type first for CPU weights. The backends it creates point at the second,
// whose default buffer type is the plain CPU one: the scheduler allocates a backend's
// intermediate results (our MUL_MAT outputs) in that type, and they must be ordinary host
// memory the CPU backend reads in place, not our weight layout.

ggml_backend_device &registered_device();
ggml_backend_device &compute_device();

const char *dev_name(ggml_backend_dev_t) { return "STACKD"; }

const char *dev_description(ggml_backend_dev_t) {
    static std::string text;
    text = std::string("stackd repacked Q4_1 matmul (") + path_name(current_path()) + ")";
    return text.c_str();
}

void dev_memory(ggml_backend_dev_t, size_t *free, size_t *total) { *free = *total = 0; }

enum ggml_backend_dev_type dev_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_ACCEL; }

void dev_props(ggml_backend_dev_t dev, ggml_backend_dev_props *props) {
    props->name = dev_name(dev);
    props->description = dev_description(dev);
    props->type = dev_type(dev);
    dev_memory(dev, &props->memory_free, &props->memory_total);
    props->caps = {/* async */ false, /* host_buffer */ false, /* buffer_from_host_ptr */ false,
                   /* events */ false, /* mmap_support */ false};
}

ggml_backend_t dev_init_backend(ggml_backend_dev_t, const char *) { return backend_new((Path)-1); }

ggml_backend_buffer_type_t dev_repack_buft(ggml_backend_dev_t) { return repack_buffer_type(); }
ggml_backend_buffer_type_t dev_cpu_buft(ggml_backend_dev_t) { return ggml_backend_cpu_buffer_type(); }

// Every MUL_MAT whose weight lives in our buffer, and nothing else. llama.cpp asks this with
// the weight placed in our buffer type to decide where a weight goes, so refusing here is
// how the buffer type refuses a weight (wrong type, 3-D expert stacks, MUL_MAT_ID, ...).
// The scheduler also asks about the weights themselves (op NONE) to place graph leaves:
// ours are ours, every other leaf belongs to the CPU.
bool in_our_buffer(const ggml_tensor *t) {
    return t != nullptr && t->buffer != nullptr && t->buffer->buft == repack_buffer_type();
}

bool dev_supports_op(ggml_backend_dev_t, const ggml_tensor *op) {
    if (op->op == GGML_OP_NONE) return in_our_buffer(op);
    return op->op == GGML_OP_MUL_MAT && in_our_buffer(op->src[0]) && can_serve(op);
}

bool dev_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) {
    return buft == repack_buffer_type() || ggml_backend_buft_is_host(buft);
}

ggml_backend_device_i device_interface(bool registered) {
    return {
        /* .get_name             = */ dev_name,
        /* .get_description      = */ dev_description,
        /* .get_memory           = */ dev_memory,
        /* .get_type             = */ dev_type,
        /* .get_props            = */ dev_props,
        /* .init_backend         = */ dev_init_backend,
        /* .get_buffer_type      = */ registered ? dev_repack_buft : dev_cpu_buft,
        /* .get_host_buffer_type = */ nullptr,
        /* .buffer_from_host_ptr = */ nullptr,
        /* .supports_op          = */ dev_supports_op,
        /* .supports_buft        = */ dev_supports_buft,
        /* .offload_op           = */ nullptr,
        /* .event_new            = */ nullptr,
        /* .event_free           = */ nullptr,
        /* .event_synchronize    = */ nullptr,
    };
}

ggml_backend_device &registered_device() {
    static ggml_backend_device dev = {device_interface(true), backend_reg(), nullptr};
    return dev;
}

ggml_backend_device &compute_device() {
    static ggml_backend_device dev = {device_interface(false), backend_reg(), nullptr};
    return dev;
}

// ---- registry ----

const char *reg_name(ggml_backend_reg_t) { return "STACKD"; }
size_t reg_device_count(ggml_backend_reg_t) { return 1; }
ggml_backend_dev_t reg_device(ggml_backend_reg_t, size_t index) {
    GGML_ASSERT(index == 0);
    return &registered_device();
}

void *reg_proc_address(ggml_backend_reg_t, const char *name) {
    // llama.cpp sets every backend's thread count to the context's before each compute.
    if (std::strcmp(name, "ggml_backend_set_n_threads") == 0) return (void *)backend_set_n_threads;
    return nullptr;
}

}  // namespace

ggml_backend_reg_t backend_reg() {
    static ggml_backend_reg reg = {
        /* .api_version = */ GGML_BACKEND_API_VERSION,
        /* .iface       = */ {reg_name, reg_device_count, reg_device, reg_proc_address},
        /* .context     = */ nullptr,
    };
    return &reg;
}

ggml_backend_buffer_type_t repack_buffer_type() {
    static ggml_backend_buffer_type buft = {
        /* .iface   = */ {buft_name, buft_alloc, buft_alignment, nullptr, buft_alloc_size,
                          buft_is_host},
        /* .device  = */ &registered_device(),
        /* .context = */ nullptr,
    };
    return &buft;
}

ggml_backend_t backend_new(Path path) {
    const int threads = (int)std::max(1u, std::thread::hardware_concurrency());
    return new ggml_backend{backend_guid(), kBackendInterface, &compute_device(),
                            new BackendContext{threads, (int)path, {}, {}}};
}

void set_path(Path path) { g_path.store((int)path); }
Path current_path() { return (Path)g_path.load(); }

}  // namespace stackd

// ---- the C entry points the Python loader calls (server/engine/accel.py) ----

namespace {
bool valid_path(int path) { return path >= 0 && path < stackd::kPathCount; }
}  // namespace

STACKD_API int stackd_kernels_best_path() { return (int)stackd::best_path(); }

STACKD_API int stackd_kernels_cpu_supports(int path) {
    return valid_path(path) && stackd::cpu_supports((stackd::Path)path);
}

STACKD_API const char *stackd_kernels_path_name(int path) {
    return valid_path(path) ? stackd::path_name((stackd::Path)path) : "?";
}

// Registers the ACCEL device into this process's ggml (once) and sets the path (-1: the best
// this CPU has). Returns the path in use, or -1 if the CPU cannot run the one asked for.
STACKD_API int stackd_kernels_register(int path) {
    if (path < 0) path = (int)stackd::best_path();
    if (!stackd_kernels_cpu_supports(path)) return -1;
    stackd::set_path((stackd::Path)path);
    static const bool registered = [] {
        ggml_backend_register(stackd::backend_reg());
        return true;
    }();
    (void)registered;
    return path;
}

STACKD_API int stackd_kernels_current_path() { return (int)stackd::current_path(); }
