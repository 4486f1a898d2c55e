#include "backend.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "ggml-backend-impl.h"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"  // the header's static helpers we do not use
#include "attention.h"
#include "ggml-impl.h"  // ggml_custom_op_params: how a GGML_OP_CUSTOM node names its function
#pragma GCC diagnostic pop
#include "backend_context.h"
#include "fusion.h"
#include "get_rows.h"
#include "huge_pages.h"
#include "lazy_commit.h"
#include "layout.h"
#include "matmul.h"
#include "profile.h"
#include "repack.h"
#include "tp.h"

namespace stackd {

// The backend's context and a tensor split's nodes (tp_backend.cpp), shared by its two files.
using namespace backend_detail;

namespace {

std::atomic<int> g_path{(int)Path::Scalar};

// ---- buffer: weights only, repacked on the way in, unpacked on the way out ----

// A weight buffer, with how many weights of each type it repacked: what a loaded model's
// description reports (which tensors run on our kernels, per type; repacked_tensors).
struct Allocation {
    void *data;
    std::array<std::atomic<int64_t>, GGML_TYPE_COUNT> repacked{};
};

std::mutex g_allocations_mutex;
std::set<const Allocation *> g_allocations;   // the live weight buffers

void buffer_free(ggml_backend_buffer_t buffer) {
    auto *alloc = static_cast<Allocation *>(buffer->context);
    {
        std::lock_guard<std::mutex> lock(g_allocations_mutex);
        g_allocations.erase(alloc);
    }
    std::free(alloc->data);
    delete alloc;
}

void *buffer_base(ggml_backend_buffer_t buffer) {
    return static_cast<Allocation *>(buffer->context)->data;
}

bool is_repacked(const ggml_tensor *t) { return is_repacked_type(t->type); }

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

void buffer_set_tensor(ggml_backend_buffer_t buffer, ggml_tensor *t, const void *data, size_t offset,
                       size_t size) {
    if (!is_repacked(t)) {
        std::memcpy(static_cast<char *>(t->data) + offset, data, size);
        return;
    }
    // Repacking needs whole rows of eight; llama.cpp loads a weight in one piece.
    GGML_ASSERT(offset == 0 && size == ggml_nbytes(t) && "stackd: weights load whole");
    // An embedding table is ours too (get_rows.h): nothing reads these bytes again.
    repack_weight(t->type, data, t->ne[1], t->ne[0], t->data);
    static_cast<Allocation *>(buffer->context)->repacked[t->type].fetch_add(1, std::memory_order_relaxed);
    release_source_pages(data, size);
}

void buffer_get_tensor(ggml_backend_buffer_t, const ggml_tensor *t, void *data, size_t offset,
                       size_t size) {
    if (!is_repacked(t)) {
        std::memcpy(data, static_cast<const char *>(t->data) + offset, size);
        return;
    }
    GGML_ASSERT(offset == 0 && size == ggml_nbytes(t) && "stackd: weights read whole");
    unpack_weight(t->type, t->data, t->ne[1], t->ne[0], data);
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

const char *buft_name(ggml_backend_buffer_type_t) { return "STACKD_x8"; }

ggml_backend_buffer_t buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    void *data = alloc_huge_aligned(size);
    if (data == nullptr) return nullptr;
    auto *alloc = new Allocation{data};
    {
        std::lock_guard<std::mutex> lock(g_allocations_mutex);
        g_allocations.insert(alloc);
    }
    return ggml_backend_buffer_init(buft, kBufferInterface, alloc, size);
}

size_t buft_alignment(ggml_backend_buffer_type_t) { return kAlignment; }

size_t buft_alloc_size(ggml_backend_buffer_type_t, const ggml_tensor *t) {
    if (!is_repacked(t)) return ggml_nbytes(t);
    return repacked_bytes(t->type, t->ne[1], t->ne[0]);
}

// Not host memory in ggml's sense: the bytes are not in ggml's layout, so no other backend
// may read them in place (ggml_backend_buft_is_host is what the CPU backend checks).
bool buft_is_host(ggml_backend_buffer_type_t) { return false; }

// ---- the served buffer: what a ggml RPC server allocates every tensor in ----
// ggml's RPC server puts everything a client allocates (weights, KV cache, compute buffers)
// in its device's default buffer type and computes whatever graph the client sends, without
// asking supports_op. So the buffer a served device hands out cannot refuse a weight the way
// the registered one does: it holds plain host bytes, repacks a Q4_1/Q8_0 tensor when one is
// written whole (how llama.cpp uploads a weight) and its shape repacks into the same bytes
// (rows a multiple of eight), and remembers which ranges it repacked. A MUL_MAT (GET_ROWS on
// Q8_0) whose weight is exactly one of them runs on our kernels; any other read or write of a
// repacked range (an op we do not serve, a partial copy) first unpacks it in place, so the
// CPU backend always sees ggml's bytes.

struct Repacked {
    uintptr_t end;
    ggml_type type;
    int64_t ne0, ne1;
};

struct ServedAllocation {
    void *data;
    std::map<uintptr_t, Repacked> repacked;   // by first byte
};

ggml_backend_buffer_type_t served_buffer_type();

ServedAllocation *served_of(const ggml_tensor *t) {
    const ggml_backend_buffer_t buffer = t->view_src ? t->view_src->buffer : t->buffer;
    if (buffer == nullptr || buffer->buft != served_buffer_type()) return nullptr;
    return static_cast<ServedAllocation *>(buffer->context);
}

// The repacked range starting at or overlapping [begin, end), or repacked.end().
std::map<uintptr_t, Repacked>::iterator overlapping(ServedAllocation *alloc, uintptr_t begin, uintptr_t end) {
    auto it = alloc->repacked.upper_bound(begin);
    if (it != alloc->repacked.begin()) {
        auto before = std::prev(it);
        if (before->second.end > begin) return before;
    }
    return it != alloc->repacked.end() && it->first < end ? it : alloc->repacked.end();
}

void unpack_in_place(std::map<uintptr_t, Repacked>::iterator it) {
    const Repacked &r = it->second;
    std::vector<uint8_t> plain(r.end - it->first);
    unpack_weight(r.type, reinterpret_cast<const void *>(it->first), r.ne1, r.ne0, plain.data());
    std::memcpy(reinterpret_cast<void *>(it->first), plain.data(), plain.size());
}

// [begin, end) of a served buffer holds ggml's bytes again (every repacked range in it unpacked).
void make_plain(ServedAllocation *alloc, uintptr_t begin, uintptr_t end) {
    for (auto it = overlapping(alloc, begin, end); it != alloc->repacked.end(); it = overlapping(alloc, begin, end)) {
        unpack_in_place(it);
        alloc->repacked.erase(it);
    }
}

void make_plain(const ggml_tensor *t) {
    ServedAllocation *alloc = served_of(t);
    if (alloc == nullptr || alloc->repacked.empty()) return;
    const auto begin = reinterpret_cast<uintptr_t>(t->data);
    make_plain(alloc, begin, begin + ggml_nbytes(t));
}

// Whether t is exactly a weight this served buffer repacked (same bytes, type and shape).
bool served_weight(const ggml_tensor *t) {
    ServedAllocation *alloc = served_of(t);
    if (alloc == nullptr || t->view_src != nullptr) return false;
    auto it = alloc->repacked.find(reinterpret_cast<uintptr_t>(t->data));
    return it != alloc->repacked.end() && it->second.type == t->type && it->second.ne0 == t->ne[0] &&
           it->second.ne1 == t->ne[1] && t->ne[2] == 1 && t->ne[3] == 1;
}

bool repacks_in_place(const ggml_tensor *t) {
    return is_repacked_type(t->type) && t->view_src == nullptr && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->ne[0] % block_length(t->type) == 0 && t->ne[1] % kRowsPerGroup == 0 && ggml_is_contiguous(t) &&
           repacked_bytes(t->type, t->ne[1], t->ne[0]) == ggml_nbytes(t);
}

void served_free(ggml_backend_buffer_t buffer) {
    auto *alloc = static_cast<ServedAllocation *>(buffer->context);
    std::free(alloc->data);
    delete alloc;
}

void *served_base(ggml_backend_buffer_t buffer) {
    return static_cast<ServedAllocation *>(buffer->context)->data;
}

void served_set_tensor(ggml_backend_buffer_t buffer, ggml_tensor *t, const void *data, size_t offset, size_t size) {
    auto *alloc = static_cast<ServedAllocation *>(buffer->context);
    const auto begin = reinterpret_cast<uintptr_t>(t->data);
    if (offset == 0 && size == ggml_nbytes(t) && repacks_in_place(t)) {
        alloc->repacked.erase(alloc->repacked.lower_bound(begin), alloc->repacked.lower_bound(begin + size));
        make_plain(alloc, begin, begin + size);   // a range that straddles the start
        repack_weight(t->type, data, t->ne[1], t->ne[0], t->data);
        alloc->repacked[begin] = {begin + size, t->type, t->ne[0], t->ne[1]};
        return;
    }
    make_plain(alloc, begin + offset, begin + offset + size);
    std::memcpy(reinterpret_cast<char *>(begin) + offset, data, size);
}

void served_get_tensor(ggml_backend_buffer_t buffer, const ggml_tensor *t, void *data, size_t offset, size_t size) {
    auto *alloc = static_cast<ServedAllocation *>(buffer->context);
    const auto begin = reinterpret_cast<uintptr_t>(t->data) + offset;
    make_plain(alloc, begin, begin + size);   // rare (a client reading a weight back): unpack for good
    std::memcpy(data, reinterpret_cast<const void *>(begin), size);
}

void served_memset_tensor(ggml_backend_buffer_t buffer, ggml_tensor *t, uint8_t value, size_t offset, size_t size) {
    auto *alloc = static_cast<ServedAllocation *>(buffer->context);
    const auto begin = reinterpret_cast<uintptr_t>(t->data) + offset;
    alloc->repacked.erase(alloc->repacked.lower_bound(begin), alloc->repacked.lower_bound(begin + size));
    make_plain(alloc, begin, begin + size);
    std::memset(reinterpret_cast<void *>(begin), value, size);
}

void served_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    auto *alloc = static_cast<ServedAllocation *>(buffer->context);
    alloc->repacked.clear();
    std::memset(alloc->data, value, buffer->size);
}

const ggml_backend_buffer_i kServedBufferInterface = {
    /* .free_buffer   = */ served_free,
    /* .get_base      = */ served_base,
    /* .init_tensor   = */ nullptr,
    /* .memset_tensor = */ served_memset_tensor,
    /* .set_tensor    = */ served_set_tensor,
    /* .get_tensor    = */ served_get_tensor,
    /* .set_tensor_2d = */ nullptr,
    /* .get_tensor_2d = */ nullptr,
    /* .cpy_tensor    = */ nullptr,
    /* .clear         = */ served_clear,
    /* .reset         = */ nullptr,
};

const char *served_buft_name(ggml_backend_buffer_type_t) { return "STACKD_served"; }

ggml_backend_buffer_t served_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    void *data = alloc_huge_aligned(size);
    if (data == nullptr) return nullptr;
    return ggml_backend_buffer_init(buft, kServedBufferInterface, new ServedAllocation{data, {}}, size);
}

size_t served_alloc_size(ggml_backend_buffer_type_t, const ggml_tensor *t) { return ggml_nbytes(t); }

// Before a graph on a served backend: every tensor a node reads or writes that overlaps a
// repacked range, other than the weight of a MUL_MAT or GET_ROWS of ours, gets ggml's bytes back.
void unpack_what_ggml_reads(ggml_cgraph *graph) {
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        ggml_tensor *node = ggml_graph_node(graph, i);
        make_plain(node);
        for (int s = 0; s < GGML_MAX_SRC; s++) {
            const ggml_tensor *src = node->src[s];
            if (src == nullptr) continue;
            if (s == 0 && served_weight(src) &&
                ((node->op == GGML_OP_MUL_MAT && can_serve(node)) ||
                 (node->op == GGML_OP_GET_ROWS && can_serve_get_rows(node)))) {
                continue;
            }
            make_plain(src);
        }
    }
}

// ---- backend: the whole graph on ggml's CPU backend, our MUL_MATs inside it ----
// ggml's scheduler splits a graph wherever the backend changes, and each split is a fork and
// join of the thread team. Had this backend computed only the MUL_MATs, a layer would be
// eight splits (norm | q k v | rope, attention | o | add, norm | gate up | silu | down), some
// 240 per step of a 30-layer model: at one token that costs more than our kernels save.
// So the device takes every op the CPU backend takes on host memory (its supports_op), the
// scheduler gives it whole graphs, and graph_compute hands them to a CPU backend of its own
// with our MUL_MATs turned into GGML_OP_CUSTOM nodes for the time of the call: ggml's threads
// run them with everything else, one fork per graph, one barrier per node (ggml's own).
// The backend's context is backend_context.h's; a tensor split's nodes are tp_backend.cpp's.

// What a task of ours reads beyond the custom op's own parameters, in the node's op_params:
// an attention's scale (attention_task), a chunked product's run (chunked_task, partial_task).
// Written by swap_in_tasks once per graph, so every thread of a node reads the same.
constexpr size_t kTaskExtraAt = sizeof(ggml_custom_op_params);
static_assert(kTaskExtraAt + sizeof(int64_t) <= GGML_MAX_OP_PARAMS);

// Runs on every thread of ggml's team for one of our MUL_MATs (GGML_OP_CUSTOM meanwhile).
void mul_mat_task(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const profile::Scope timed(profile::of_mul_mat(dst), ith);
    auto *ctx = static_cast<BackendContext *>(userdata);
    mul_mat_share(dst, kernels_of(ctx), ctx->act, ctx->epoch, ith, nth);
}

}  // namespace

bool backend_detail::is_plain_product(const ggml_tensor *node) {
    if (node->op != GGML_OP_CUSTOM) return false;
    ggml_custom_op_params task;
    std::memcpy(&task, node->op_params, sizeof task);
    return task.fun == mul_mat_task;
}

namespace {

// ---- the products a tensor split cuts by input columns: the chunked form (kernels.h) ----
// On one node as on a split, so that a split's answers are one node's (docs/cluster.md,
// "Answers"). A whole weight's runs follow from its K alone, so that one node, a layer split's
// nodes (the served device) and every process agree without being told: attn_output the
// largest power of two dividing K, 32 to 256 (576: 64; 2,048: 256); ffn_down 1,024 or 512 where
// that cuts K into 8 or more, else 256 (server/engine/accel.py has the same rule, for the
// shard planner, which cuts on them). A shard's K is its slice, so a tensor split's worker sets
// the whole weight's runs (set_runs). Each run's float sums are widened and added once: about
// 130 cycles a 16-row, 8-token tile, 23 % of an 8192 x 2048 Q4_0 product at 16 tokens with runs
// of 256, 6 % with 1,024; so runs as long as the cuts allow.
}  // namespace

int64_t chunk_run_for(bool attn_output, int64_t k) {
    if (attn_output) return std::clamp<int64_t>(k & -k, 32, 256);
    for (const int64_t run : {int64_t(1024), int64_t(512)}) {
        if (k % run == 0 && k / run >= 8) return run;
    }
    return 256;
}

namespace {

std::atomic<int64_t> g_attn_chunk{0};    // set_runs (backend.h), a shard's; 0: from the weight
std::atomic<int64_t> g_ffn_chunk{0};
std::atomic<bool> g_chunked{true};       // set_chunked (backend.h)

bool ends_with(const char *s, const char *suffix) {
    const size_t n = std::strlen(s), m = std::strlen(suffix);
    return n >= m && std::strcmp(s + n - m, suffix) == 0;
}

// Weights per run of the chunked form for this product's weight, or 0 (the plain form).
int64_t chunk_columns(const ggml_tensor *node) {
    const ggml_tensor *w = node->src[0];
    if (node->ne[2] != 1 || node->ne[3] != 1 || !g_chunked.load(std::memory_order_relaxed)) return 0;
    const bool attn_output = ends_with(w->name, ".attn_output.weight");
    if (!attn_output && !ends_with(w->name, ".ffn_down.weight")) return 0;
    const int64_t set = (attn_output ? g_attn_chunk : g_ffn_chunk).load(std::memory_order_relaxed);
    return set > 0 ? set : chunk_run_for(attn_output, w->ne[0]);
}

// The run swap_in_tasks chose for this node (kTaskExtraAt).
int64_t run_of(const ggml_tensor *dst) {
    int64_t run;
    std::memcpy(&run, (const char *)dst->op_params + kTaskExtraAt, sizeof run);
    return run;
}

void chunked_task(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const profile::Scope timed(profile::kMatmul, ith);
    auto *ctx = static_cast<BackendContext *>(userdata);
    mul_mat_share(dst, kernels_of(ctx), ctx->act, ctx->epoch, ith, nth, 0, -1, {run_of(dst), nullptr});
}

// The same, keeping the sums before rounding for the exchange (a tensor-parallel graph).
void partial_task(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const profile::Scope timed(profile::kMatmul, ith);
    auto *ctx = static_cast<BackendContext *>(userdata);
    if (ith == 0) ctx->partial_of = dst;   // read after the node's barrier
    mul_mat_share(dst, kernels_of(ctx), ctx->act, ctx->epoch, ith, nth, 0, -1, {run_of(dst), ctx->partial.data()});
}

const char *backend_name(ggml_backend_t) { return "STACKD"; }

void backend_free(ggml_backend_t backend) {
    auto *ctx = static_cast<BackendContext *>(backend->context);
    ggml_backend_free(ctx->cpu);
    delete ctx;
    delete backend;
}

bool in_our_buffer(const ggml_tensor *t);

// Runs on every thread of ggml's team for a GET_ROWS on a table of ours (get_rows.h).
void get_rows_task(ggml_tensor *dst, int ith, int nth, void *) {
    const profile::Scope timed(profile::kGetRows, ith);
    get_rows_share(dst, ith, nth);
}

// Runs on every thread of ggml's team for a FLASH_ATTN_EXT of ours (attention.h). The node's
// scale rides in its op_params after the custom op's own (kTaskExtraAt; swap_in_tasks puts it there).

void attention_task(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const profile::Scope timed(profile::kAttention, ith);
    float scale;
    std::memcpy(&scale, (const char *)dst->op_params + kTaskExtraAt, sizeof scale);
    attention_share(dst, scale, kernels_of(static_cast<BackendContext *>(userdata)).attend, ith, nth);
}

// Whether decode attention is ours (stackd_kernels_attention; on unless a benchmark turns it off),
// and a prompt's too (stackd_kernels_prefill_attention): on a long prompt ggml's tiled flash
// attention is most of the prefill (bench/roofline.py --prefill), and ours, one query row at a
// time with whole blocks of masked cells skipped, takes less; each row's numbers then depend
// on nothing else in its step, prompts' rows as decoding rows.
std::atomic<bool> g_attention{true};
std::atomic<bool> g_prefill_attention{true};
std::atomic<uint64_t> g_attention_nodes{0};  // FLASH_ATTN_EXT nodes computed by ours (a test's question)

// GET_ROWS nodes run on tables of ours, ever: whether a model's embedding table is ours (a
// test's question: when it is not, llama.cpp loads a tied table twice).
std::atomic<uint64_t> g_get_rows_nodes{0};

}  // namespace

// Whether a MUL_MAT or GET_ROWS node is ours: on the registered device, any on a weight in our
// buffer (supports_op let in only those we serve); on a served one, those whose weight is a
// repacked one of a served buffer and whose shapes we serve (unpack_what_ggml_reads ran first).
bool backend_detail::ours(const BackendContext *ctx, const ggml_tensor *node) {
    if (!ctx->served) return in_our_buffer(node->src[0]);
    if (!served_weight(node->src[0])) return false;
    return node->op == GGML_OP_MUL_MAT ? can_serve(node) : can_serve_get_rows(node);
}

namespace {

// The buffer a weight or a KV cache lives in goes on huge pages, the first time a graph reads
// it (huge_pages.h). Our own buffers are not "host" in ggml's sense; their base is theirs.
// Every graph passes here for every node of ours, so the backend remembers what it marked
// (one lookup, no lock) before advise_huge's process-wide record is asked. A cache committed
// as it is written (lazy_commit.h) stays on small pages: marked, each first write to a 2 MiB
// range would take and zero all of it (the first answer's request took 238 MB and 0.13 s).
void advise_buffer(BackendContext *ctx, const ggml_tensor *t) {
    const ggml_backend_buffer_t buffer = t->view_src ? t->view_src->buffer : t->buffer;
    if (buffer == nullptr || !ctx->advised.insert(buffer).second) return;
    if (clears_by_release(buffer)) return;
    if (ggml_backend_buffer_get_base(buffer) != nullptr)
        advise_huge(ggml_backend_buffer_get_base(buffer), ggml_backend_buffer_get_size(buffer));
}

// Ours become custom ops (op and op_params kept to put back); the scratch is sized first.
// Attention is ours on the steps ggml would compute one row at a time (per_row: its reference
// path, which ours replaces, so a row's numbers still depend on nothing else in its step).
// In a tensor-parallel group (tp) the residual adds and the vocabulary projection become
// exchanges too; a node of those names that is not what they should be refuses the whole graph
// (returns why: the caller fails the group) rather than compute numbers that mean nothing.
std::string swap_in_tasks(BackendContext *ctx, ggml_cgraph *graph, bool per_row, bool tp) {
    ctx->swapped.clear();
    ctx->partial_of = nullptr;
    const bool attention = (per_row || g_prefill_attention.load(std::memory_order_relaxed)) &&
                           g_attention.load(std::memory_order_relaxed);
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        ggml_tensor *node = ggml_graph_node(graph, i);
        if (tp) {
            const bool residual = residual_add_name(node->name);
            const bool logits = !residual && std::strcmp(node->name, "result_output") == 0;
            if (residual || logits) {
                const std::string problem = residual ? residual_add_problem(node) : logits_problem(ctx, node);
                if (!problem.empty()) return std::string(node->name) + " " + problem;
                ctx->swapped.push_back({node, node->op, {}});
                std::memcpy(ctx->swapped.back().params.data(), node->op_params, sizeof(node->op_params));
                ggml_custom_op_params task = {allreduce_task, 1, ctx};
                if (logits) {
                    advise_buffer(ctx, node->src[0]);
                    reserve_activations(ctx->act, node);
                    ctx->candidates.resize((size_t)node->ne[1] * tp::kMaxCandidates);   // a follower's picks
                    task = {logits_task, GGML_N_TASKS_MAX, ctx};
                }
                node->op = GGML_OP_CUSTOM;
                std::memcpy(node->op_params, &task, sizeof(task));
                continue;
            }
        }
        const bool attend = attention && node->op == GGML_OP_FLASH_ATTN_EXT && can_attend(node);
        if (!attend && ((node->op != GGML_OP_MUL_MAT && node->op != GGML_OP_GET_ROWS) || !ours(ctx, node))) continue;
        ctx->swapped.push_back({node, node->op, {}});
        std::memcpy(ctx->swapped.back().params.data(), node->op_params, sizeof(node->op_params));
        ggml_custom_op_params task = {get_rows_task, GGML_N_TASKS_MAX, ctx};
        int64_t run = 0;                       // a chunked product's (kTaskExtraAt)
        if (attend) {
            advise_buffer(ctx, node->src[1]);  // the KV cache
            advise_buffer(ctx, node->src[2]);
            task.fun = attention_task;
            g_attention_nodes.fetch_add(1, std::memory_order_relaxed);
        } else if (node->op == GGML_OP_MUL_MAT) {
            advise_buffer(ctx, node->src[0]);  // the weights
            reserve_activations(ctx->act, node);
            task.fun = mul_mat_task;
            run = chunk_columns(node);
            if (run > 0) {
                task.fun = tp ? partial_task : chunked_task;
                // rows as dst's (its nb[1] may pad them): the largest such product of the graph
                const size_t need = (size_t)(node->nb[1] / sizeof(float)) * (size_t)node->ne[1];
                if (tp && ctx->partial.size() < need) ctx->partial.resize(need);
            }
        } else {
            g_get_rows_nodes.fetch_add(1, std::memory_order_relaxed);
        }
        node->op = GGML_OP_CUSTOM;
        std::memcpy(node->op_params, &task, sizeof(task));
        if (attend) std::memcpy((char *)node->op_params + kTaskExtraAt, ctx->swapped.back().params.data(), sizeof(float));
        if (run > 0) std::memcpy((char *)node->op_params + kTaskExtraAt, &run, sizeof run);
    }
    if (!tp) fuse_graph(ctx, graph);
    return "";
}

// Last change first: a node fusion rewrote after its swap gets its first state back.
void swap_back(BackendContext *ctx) {
    for (auto it = ctx->swapped.rbegin(); it != ctx->swapped.rend(); ++it) {
        it->node->op = it->op;
        std::memcpy(it->node->op_params, it->params.data(), sizeof(it->node->op_params));
    }
    ctx->swapped.clear();
}

// ---- One arithmetic per row ----
// Our kernels give a row the same numbers in any batch; ggml's CPU ops around them do not
// quite. Its flash attention takes a tiled path for 64 query rows or more (a prompt's prefill,
// or a decoding row in a step with one) and a KV-split path for a step of one token of one
// sequence over 512 cells; its tiled K-quant matmul starts at 8 rows. Each adds in another
// order than the per-row loops, so a greedy answer can depend on what shared its steps.
// ggml's reference switch (use_ref) keeps a step on the per-row paths (and turns off op
// fusion, which computes the same numbers). By default it is on for the steps without tiled
// attention, which are every decode and verification step: a drafted sequence's verification
// then gives the numbers its one-token steps would, and speculative decoding never changes a
// greedy answer. engine.batch_invariant turns it on for prefills too, at a cost in long
// prompts (kernels/README.md). Read at every graph, so a process can measure each
// (bench/batch_invariance.py).
std::atomic<int> g_invariance{(int)Invariance::kDecodeSteps};

constexpr int64_t kTiledAttentionRows = 64;  // ggml-cpu's GGML_FA_TILE_Q

ggml_backend_dev_t cpu_device();

bool has_tiled_attention(ggml_cgraph *graph) {
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        const ggml_tensor *node = ggml_graph_node(graph, i);
        if (node->op == GGML_OP_FLASH_ATTN_EXT && node->src[0]->ne[1] >= kTiledAttentionRows) return true;
    }
    return false;
}

// Whether this graph's steps keep one arithmetic per row (the invariance setting, above).
bool per_row_graph(ggml_cgraph *graph) {
    const auto invariance = (Invariance)g_invariance.load();
    return invariance == Invariance::kAllSteps ||
           (invariance == Invariance::kDecodeSteps && !has_tiled_attention(graph));
}

void follow_invariance(ggml_backend_t cpu, bool per_row) {
    using SetUseRef = void (*)(ggml_backend_t, bool);
    static const auto set_use_ref = (SetUseRef)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(cpu_device()), "ggml_backend_cpu_set_use_ref");
    if (set_use_ref != nullptr) set_use_ref(cpu, per_row);
}

// The nodes ggml's team computes (each ends at a barrier), fused-away and view nodes not counted.
uint64_t computing_nodes(ggml_cgraph *graph) {
    uint64_t n = 0;
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        n += !ggml_op_is_empty(ggml_graph_node(graph, i)->op);
    }
    return n;
}

ggml_status backend_graph_compute(ggml_backend_t backend, ggml_cgraph *graph) {
    auto *ctx = static_cast<BackendContext *>(backend->context);
    ctx->epoch++;  // what the scratch held belongs to the last computation
    if (ctx->served) unpack_what_ggml_reads(graph);
    // a failed tensor-parallel group fails every graph until detached (llama_decode fails)
    const uint64_t generation = tp::generation();
    const bool tp = !ctx->served && tp::attached();
    if (tp && tp::failed()) return GGML_STATUS_FAILED;
    ctx->tp_generation.store(tp ? generation : 0, std::memory_order_relaxed);
    const bool per_row = per_row_graph(graph);  // before the swap: it reads the attention nodes
    const std::string problem = swap_in_tasks(ctx, graph, per_row, tp);
    if (!problem.empty()) {
        swap_back(ctx);
        ctx->tp_generation.store(0, std::memory_order_relaxed);
        tp::fail(("tensor parallelism: this graph cannot be split: " + problem).c_str());
        return GGML_STATUS_FAILED;
    }
    follow_invariance(ctx->cpu, per_row);
    ggml_status status;
    {
        const profile::Scope timed(profile::kGraph, 0);
        if (profile::g_on.load(std::memory_order_relaxed)) profile::add_nodes(computing_nodes(graph));
        status = ggml_backend_graph_compute(ctx->cpu, graph);
    }
    swap_back(ctx);
    if (tp_lost(ctx)) status = GGML_STATUS_FAILED;   // an exchange failed (or the group was left): the rest was skipped
    ctx->tp_generation.store(0, std::memory_order_relaxed);
    return status;
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

ggml_backend_dev_t cpu_device() {
    static ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    return dev;
}

void backend_set_n_threads(ggml_backend_t backend, int n_threads) {
    auto *ctx = static_cast<BackendContext *>(backend->context);
    ctx->n_threads = n_threads > 0 ? n_threads : 1;
    static const auto cpu_set_n_threads = (ggml_backend_set_n_threads_t)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(cpu_device()), "ggml_backend_set_n_threads");
    cpu_set_n_threads(ctx->cpu, ctx->n_threads);
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
ggml_backend_device &served_device();

const char *dev_name(ggml_backend_dev_t) { return "STACKD"; }

const char *dev_description(ggml_backend_dev_t) {
    static std::string text;
    text = std::string("stackd repacked Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K matmul (") + path_name(current_path()) + ")";
    return text.c_str();
}

void dev_memory(ggml_backend_dev_t dev, size_t *free, size_t *total) {
    if (dev == &served_device()) {          // an RPC client asks what the node has
        ggml_backend_dev_memory(cpu_device(), free, total);
        return;
    }
    *free = *total = 0;
}

enum ggml_backend_dev_type dev_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_ACCEL; }

void dev_props(ggml_backend_dev_t dev, ggml_backend_dev_props *props) {
    props->name = dev_name(dev);
    props->description = dev_description(dev);
    props->type = dev_type(dev);
    dev_memory(dev, &props->memory_free, &props->memory_total);
    props->caps = {/* async */ false, /* host_buffer */ false, /* buffer_from_host_ptr */ false,
                   /* events */ false, /* mmap_support */ false};
}

ggml_backend_t dev_init_backend(ggml_backend_dev_t dev, const char *) {
    return dev == &served_device() ? served_backend_new() : backend_new((Path)-1);
}

ggml_backend_buffer_type_t dev_repack_buft(ggml_backend_dev_t) { return repack_buffer_type(); }
ggml_backend_buffer_type_t dev_cpu_buft(ggml_backend_dev_t) { return ggml_backend_cpu_buffer_type(); }
ggml_backend_buffer_type_t dev_served_buft(ggml_backend_dev_t) { return served_buffer_type(); }

bool in_our_buffer(const ggml_tensor *t) {
    return t != nullptr && t->buffer != nullptr && t->buffer->buft == repack_buffer_type();
}

// In memory neither ours nor the host's (another device's, or the CPU's own repacked types).
bool in_foreign_buffer(const ggml_tensor *t) {
    const ggml_backend_buffer_t buffer = t->view_src ? t->view_src->buffer : t->buffer;
    return buffer != nullptr && buffer->buft != repack_buffer_type() && !ggml_backend_buft_is_host(buffer->buft);
}

// A MUL_MAT on a weight in our buffer when we can serve it, and a GET_ROWS on a Q8_0 table
// (get_rows.h); no other op on our weights; anything else the CPU backend computes on host
// memory (that one runs it: graph_compute). llama.cpp asks this with a weight placed in our
// buffer type to decide where it goes, so refusing here is how the buffer type refuses a
// weight (wrong type, 3-D expert stacks, MUL_MAT_ID, a Q4_1 embedding table, norms, ...).
bool dev_supports_op(ggml_backend_dev_t, const ggml_tensor *op) {
    if (op->op == GGML_OP_MUL_MAT && in_our_buffer(op->src[0])) return can_serve(op);
    if (op->op == GGML_OP_GET_ROWS && in_our_buffer(op->src[0])) return can_serve_get_rows(op);
    if (op->op == GGML_OP_NONE && in_our_buffer(op)) return true;
    if (in_our_buffer(op) || in_foreign_buffer(op)) return false;
    for (const ggml_tensor *src : op->src) {
        if (src != nullptr && (in_our_buffer(src) || in_foreign_buffer(src))) return false;
    }
    return ggml_backend_dev_supports_op(cpu_device(), op);
}

bool dev_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) {
    return buft == repack_buffer_type() || ggml_backend_buft_is_host(buft);
}

enum class DeviceKind { registered, compute, served };

ggml_backend_device_i device_interface(DeviceKind kind) {
    return {
        /* .get_name             = */ dev_name,
        /* .get_description      = */ dev_description,
        /* .get_memory           = */ dev_memory,
        /* .get_type             = */ dev_type,
        /* .get_props            = */ dev_props,
        /* .init_backend         = */ dev_init_backend,
        /* .get_buffer_type      = */ kind == DeviceKind::registered ? dev_repack_buft
                                     : kind == DeviceKind::served   ? dev_served_buft
                                                                    : dev_cpu_buft,
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
    static ggml_backend_device dev = {device_interface(DeviceKind::registered), backend_reg(), nullptr};
    return dev;
}

ggml_backend_device &compute_device() {
    static ggml_backend_device dev = {device_interface(DeviceKind::compute), backend_reg(), nullptr};
    return dev;
}

// What an RPC server serves: never in the registry (llama.cpp in this process never sees
// it); its default buffer type is the served one, and its backends are served backends.
ggml_backend_device &served_device() {
    static ggml_backend_device dev = {device_interface(DeviceKind::served), backend_reg(), nullptr};
    return dev;
}

// ---- registry ----

const char *reg_name(ggml_backend_reg_t) { return "STACKD"; }
size_t reg_device_count(ggml_backend_reg_t) { return 1; }
ggml_backend_dev_t reg_device(ggml_backend_reg_t, size_t index) {
    GGML_ASSERT(index == 0);
    return &registered_device();
}

uint64_t get_rows_nodes() { return g_get_rows_nodes.load(); }

void *reg_proc_address(ggml_backend_reg_t, const char *name) {
    // llama.cpp sets every backend's thread count to the context's before each compute.
    if (std::strcmp(name, "ggml_backend_set_n_threads") == 0) return (void *)backend_set_n_threads;
    if (std::strcmp(name, kGetRowsNodesProc) == 0) return (void *)get_rows_nodes;
    // tensor parallelism's C API (tp.h), so native/engine finds it without linking us
    static const std::pair<const char *, void *> tp_api[] = {
        {"stackd_tp_attach", (void *)stackd_tp_attach},
        {"stackd_tp_detach", (void *)stackd_tp_detach},
        {"stackd_tp_active", (void *)stackd_tp_active},
        {"stackd_tp_failed", (void *)stackd_tp_failed},
        {"stackd_tp_error", (void *)stackd_tp_error},
        {"stackd_tp_send_control", (void *)stackd_tp_send_control},
        {"stackd_tp_recv_control", (void *)stackd_tp_recv_control},
        {"stackd_tp_counters", (void *)stackd_tp_counters},
        {"stackd_tp_exchange_ns", (void *)stackd_tp_exchange_ns},
        {"stackd_tp_set_gather", (void *)stackd_tp_set_gather},
        {"stackd_tp_gather_counters", (void *)stackd_tp_gather_counters},
    };
    for (const auto &[tp_name, fn] : tp_api) {
        if (std::strcmp(name, tp_name) == 0) return fn;
    }
    return nullptr;
}

}  // namespace

int64_t repacked_tensors(ggml_type type) {
    if (type < 0 || type >= GGML_TYPE_COUNT) return 0;
    std::lock_guard<std::mutex> lock(g_allocations_mutex);
    int64_t n = 0;
    for (const Allocation *alloc : g_allocations) n += alloc->repacked[type].load(std::memory_order_relaxed);
    return n;
}

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

namespace {
ggml_backend_buffer_type_t served_buffer_type() {
    static ggml_backend_buffer_type buft = {
        /* .iface   = */ {served_buft_name, served_alloc, buft_alignment, nullptr, served_alloc_size,
                          buft_is_host},
        /* .device  = */ &served_device(),
        /* .context = */ nullptr,
    };
    return &buft;
}
}  // namespace

ggml_backend_dev_t served_device_handle() { return &served_device(); }

// Our tasks meet at an OpenMP barrier inside ggml's parallel region: a ggml built with its
// own thread pool instead runs them with no team to meet, so the kernels stay off there.
bool cpu_backend_uses_openmp() {
    auto get_features = (ggml_backend_get_features_t)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(cpu_device()), "ggml_backend_get_features");
    for (const ggml_backend_feature *f = get_features ? get_features(ggml_backend_dev_backend_reg(cpu_device())) : nullptr;
         f != nullptr && f->name != nullptr; f++) {
        if (std::strcmp(f->name, "OPENMP") == 0) return true;
    }
    return false;
}

namespace {
ggml_backend_t new_backend(Path path, ggml_backend_dev_t device, bool served) {
    const int threads = (int)std::max(1u, std::thread::hardware_concurrency());
    auto *ctx = new BackendContext;
    ctx->fixed_path = (int)path;
    ctx->served = served;
    ctx->cpu = ggml_backend_dev_init(cpu_device(), nullptr);
    ggml_backend_t backend = new ggml_backend{backend_guid(), kBackendInterface, device, ctx};
    backend_set_n_threads(backend, threads);
    if (!served) {
        // a tensor-parallel exchange that fails skips the rest of its graph (tp.h)
        static const auto set_abort = (ggml_backend_set_abort_callback_t)ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(cpu_device()), "ggml_backend_set_abort_callback");
        if (set_abort != nullptr) {
            set_abort(ctx->cpu, [](void *data) { return tp_lost(static_cast<const BackendContext *>(data)); }, ctx);
        }
    }
    return backend;
}
}  // namespace

ggml_backend_t backend_new(Path path) { return new_backend(path, &compute_device(), false); }
ggml_backend_t served_backend_new() { return new_backend((Path)-1, &served_device(), true); }

void set_path(Path path) { g_path.store((int)path); }
void set_invariance(Invariance invariance) { g_invariance.store((int)invariance); }
void set_attention(bool on) { g_attention.store(on); }
void set_prefill_attention(bool on) { g_prefill_attention.store(on); }
void set_chunked(bool on) { g_chunked.store(on); }
bool set_runs(int64_t attn_output, int64_t ffn_down) {
    if (attn_output == 0 && ffn_down == 0) {   // back to each weight's own
        g_attn_chunk.store(0);
        g_ffn_chunk.store(0);
        return true;
    }
    const bool attn_ok = attn_output >= 32 && attn_output <= 65536 && attn_output % 32 == 0;
    const bool ffn_ok = ffn_down >= 256 && ffn_down <= 65536 && ffn_down % 256 == 0;
    if (!attn_ok || !ffn_ok) return false;
    g_attn_chunk.store(attn_output);
    g_ffn_chunk.store(ffn_down);
    return true;
}
uint64_t attention_nodes() { return g_attention_nodes.load(); }
Path current_path() { return (Path)g_path.load(); }

}  // namespace stackd
