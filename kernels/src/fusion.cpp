#include "fusion.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <unordered_map>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"  // the header's static helpers we do not use
#include "ggml-impl.h"  // ggml_custom_op_params
#pragma GCC diagnostic pop
#include "matmul.h"
#include "profile.h"

namespace stackd::backend_detail {

namespace {

std::atomic<bool> g_fusion{true};
std::atomic<uint64_t> g_fused_nodes{0};

// Where a fused node's task finds its record (an index into ctx->fusions), after the custom
// op's own parameters.
constexpr size_t kRecordAt = sizeof(ggml_custom_op_params);
static_assert(kRecordAt + sizeof(int64_t) <= GGML_MAX_OP_PARAMS);

constexpr int kMaxBetween = 8;       // nodes a later product may be moved before

// What ggml's CPU backend computes (and meets its threads after): not a view, nor a node fused away.
bool computes(const ggml_tensor *node) { return !ggml_op_is_empty(node->op); }

bool overlap(const ggml_tensor *a, const ggml_tensor *b) {
    if (a == nullptr || b == nullptr || a->data == nullptr || b->data == nullptr) return false;
    const char *a0 = static_cast<const char *>(a->data), *b0 = static_cast<const char *>(b->data);
    return a0 < b0 + ggml_nbytes(b) && b0 < a0 + ggml_nbytes(a);
}

// Whether writing `out` early can change what `node` reads or writes.
bool touches(const ggml_tensor *node, const ggml_tensor *out) {
    if (overlap(node, out)) return true;
    for (const ggml_tensor *src : node->src) {
        if (overlap(src, out)) return true;
    }
    return false;
}

bool plain_rows(const ggml_tensor *t) {   // f32, each row contiguous
    return t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float);
}

int64_t rows_of(const ggml_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

float *row(const ggml_tensor *t, int64_t r) {
    const int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
    return reinterpret_cast<float *>(static_cast<char *>(t->data) + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3]);
}

// Two tensors that are the same memory laid out the same way (an in-place op), or apart.
bool same_or_apart(const ggml_tensor *a, const ggml_tensor *b) {
    if (!overlap(a, b)) return true;
    return a->data == b->data && std::memcmp(a->nb, b->nb, sizeof(a->nb)) == 0 &&
           std::memcmp(a->ne, b->ne, sizeof(a->ne)) == 0;
}

void record_swap(BackendContext *ctx, ggml_tensor *node) {
    ctx->swapped.push_back({node, node->op, {}});
    std::memcpy(ctx->swapped.back().params.data(), node->op_params, sizeof(node->op_params));
}

void become_task(BackendContext *ctx, ggml_tensor *node, ggml_custom_op_t fun, int64_t record) {
    record_swap(ctx, node);
    const ggml_custom_op_params task = {fun, GGML_N_TASKS_MAX, ctx};
    node->op = GGML_OP_CUSTOM;
    std::memcpy(node->op_params, &task, sizeof(task));
    std::memcpy((char *)node->op_params + kRecordAt, &record, sizeof record);
}

void become_none(BackendContext *ctx, ggml_tensor *node) {
    record_swap(ctx, node);
    node->op = GGML_OP_NONE;
}

int64_t record_of(const ggml_tensor *dst) {
    int64_t record;
    std::memcpy(&record, (const char *)dst->op_params + kRecordAt, sizeof record);
    return record;
}

// ---- the residual add, the norm and its weight ----

// Thread ith's rows: [add:] sum = a + b, then out = (sum * scale) * w with ggml's scale.
void norm_task(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const profile::Scope timed(profile::kNorms, ith);
    const auto &f = static_cast<BackendContext *>(userdata)->fusions.norms[(size_t)record_of(dst)];
    const ggml_tensor *x = f.add ? f.add : f.norm->src[0];
    const int64_t n = x->ne[0];
    int64_t begin, end;
    share(rows_of(x), ith, nth, &begin, &end);
    const float *w = static_cast<const float *>(f.weight->data);
    for (int64_t r = begin; r < end; r++) {
        float *xr = row(x, r);
        if (f.add) {
            const float *a = row(f.add->src[0], r), *b = row(f.add->src[1], r);
            for (int64_t i = 0; i < n; i++) xr[i] = a[i] + b[i];
        }
        double sum = 0.0;   // ggml_float, in element order (ggml-cpu's rms_norm_f32)
        for (int64_t i = 0; i < n; i++) sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / (double)n);
        const float scale = 1.0f / sqrtf(mean + f.eps);
        float *out = row(f.mul, r);
        if (f.weight_first) {
            for (int64_t i = 0; i < n; i++) out[i] = w[i] * (xr[i] * scale);
        } else {
            for (int64_t i = 0; i < n; i++) out[i] = (xr[i] * scale) * w[i];
        }
    }
}

// The next node from i on that computes, or -1.
int next_computing(ggml_cgraph *graph, int i) {
    for (; i < ggml_graph_n_nodes(graph); i++) {
        if (computes(ggml_graph_node(graph, i))) return i;
    }
    return -1;
}

// Readers of each norm among the graph's nodes (a norm's output must have one: its MUL). Only
// norms are counted: one load of a source's op filters out the other ~10,000 sources a step.
using Readers = std::unordered_map<const ggml_tensor *, int>;

Readers readers_of_norms(ggml_cgraph *graph) {
    Readers readers;
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        for (const ggml_tensor *src : ggml_graph_node(graph, i)->src) {
            if (src != nullptr && src->op == GGML_OP_RMS_NORM) readers[src]++;
        }
    }
    return readers;
}

// The fusion of the norm at `norm_at` (the ADD at `add_at` before it unless -1): the MUL's
// index, or -1 when they cannot fuse.
int fuse_norm(BackendContext *ctx, ggml_cgraph *graph, int add_at, int norm_at, const Readers &readers) {
    ggml_tensor *norm = ggml_graph_node(graph, norm_at);
    ggml_tensor *add = add_at >= 0 ? ggml_graph_node(graph, add_at) : nullptr;
    const int mul_at = next_computing(graph, norm_at + 1);
    if (mul_at < 0) return -1;
    ggml_tensor *mul = ggml_graph_node(graph, mul_at);
    if (norm->op != GGML_OP_RMS_NORM || mul->op != GGML_OP_MUL) return -1;
    if (!plain_rows(norm) || !plain_rows(norm->src[0]) || !plain_rows(mul) || !ggml_are_same_shape(norm, mul)) return -1;
    const bool weight_first = mul->src[1] == norm;
    if (!weight_first && mul->src[0] != norm) return -1;
    const ggml_tensor *w = weight_first ? mul->src[0] : mul->src[1];
    if (w->type != GGML_TYPE_F32 || !ggml_is_contiguous(w) || w->ne[0] != norm->ne[0] || ggml_nrows(w) != 1) return -1;
    const auto it = readers.find(norm);
    if (it == readers.end() || it->second != 1 || (norm->flags & GGML_TENSOR_FLAG_OUTPUT)) return -1;
    if (add != nullptr) {
        if (norm->src[0] != add || !plain_rows(add) || !plain_rows(add->src[0]) || !plain_rows(add->src[1]) ||
            !ggml_are_same_shape(add, add->src[0]) || !ggml_are_same_shape(add, add->src[1])) return -1;
        if (!same_or_apart(add, add->src[0]) || !same_or_apart(add, add->src[1])) return -1;
        // a row's inputs are read whole before its output is written: the same memory laid out the
        // same way is no harm (ggml's allocator hands the residual's memory on to the norm's output)
        if (!same_or_apart(mul, add->src[0]) || !same_or_apart(mul, add->src[1])) return -1;
    }
    const ggml_tensor *x = add ? add : norm->src[0];
    if (!same_or_apart(mul, x) || overlap(mul, w)) return -1;
    float eps;
    std::memcpy(&eps, norm->op_params, sizeof eps);
    ctx->fusions.norms.push_back({add, norm, mul, w, eps, weight_first});
    const int64_t record = (int64_t)ctx->fusions.norms.size() - 1;
    // The fused node stands where its first node does; the rest are skipped.
    if (add != nullptr) {
        become_task(ctx, add, norm_task, record);
        become_none(ctx, norm);
    } else {
        become_task(ctx, norm, norm_task, record);
    }
    become_none(ctx, mul);
    return mul_at;
}

// ---- products of the same activations ----

void products_task(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const profile::Scope timed(profile::kMatmul, ith);
    auto *ctx = static_cast<BackendContext *>(userdata);
    const auto &group = ctx->fusions.groups[(size_t)record_of(dst)];
    const Kernels kernels = kernels_of(ctx);
    const QuantizedInput input = mul_mat_input(group.products[0], ctx->act, ctx->epoch, ith, nth);
    for (int i = 0; i < group.n; i++) mul_mat_rows(group.products[i], kernels, input, ith, nth);
}

bool same_activation_kind(const ggml_tensor *a, const ggml_tensor *b) {
    return is_k_quant(a->src[0]->type) == is_k_quant(b->src[0]->type);
}

// The products after the one at `first` that read its activations, joined to it; the index
// of the last node looked at.
int fuse_products(BackendContext *ctx, ggml_cgraph *graph, int first) {
    ggml_tensor *lead = ggml_graph_node(graph, first);
    const ggml_tensor *input = lead->src[1];
    BackendContext::Fusions::Group group;
    group.products[group.n++] = lead;
    int joined[BackendContext::Fusions::kMaxProducts] = {first};
    int last = first;
    for (int i = first + 1, between = 0; i < ggml_graph_n_nodes(graph) && group.n < BackendContext::Fusions::kMaxProducts && between <= kMaxBetween; i++) {
        ggml_tensor *node = ggml_graph_node(graph, i);
        if (!computes(node)) continue;
        const bool candidate = is_plain_product(node) && node->src[1] == input && same_activation_kind(node, lead);
        bool ok = candidate;
        // its output early must not change what ran between, nor the inputs or the group's outputs
        for (int j = first + 1; ok && j < i; j++) {
            const ggml_tensor *other = ggml_graph_node(graph, j);
            if (!computes(other) || std::find(joined, joined + group.n, j) != joined + group.n) continue;
            ok = !touches(other, node);
        }
        ok = ok && !overlap(node, input);
        for (int g = 0; ok && g < group.n; g++) ok = !overlap(node, group.products[g]);
        if (ok) {
            joined[group.n] = i;
            group.products[group.n++] = node;
            last = i;
            continue;
        }
        // a node between must not write what the group reads
        if (overlap(node, input) || candidate) break;
        between++;
    }
    if (group.n < 2) return first;
    ctx->fusions.groups.push_back(group);
    const int64_t record = (int64_t)ctx->fusions.groups.size() - 1;
    become_task(ctx, lead, products_task, record);
    for (int g = 1; g < group.n; g++) become_none(ctx, group.products[g]);
    return last;
}

}  // namespace

void fuse_graph(BackendContext *ctx, ggml_cgraph *graph) {
    ctx->fusions.norms.clear();
    ctx->fusions.groups.clear();
    if (!g_fusion.load(std::memory_order_relaxed)) return;
    int fused = 0;
    Readers readers;
    bool have_readers = false;
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        ggml_tensor *node = ggml_graph_node(graph, i);
        if (node->op == GGML_OP_ADD || node->op == GGML_OP_RMS_NORM) {
            const int norm_at = node->op == GGML_OP_ADD ? next_computing(graph, i + 1) : i;
            if (norm_at < 0 || ggml_graph_node(graph, norm_at)->op != GGML_OP_RMS_NORM) continue;
            if (!have_readers) {
                readers = readers_of_norms(graph);
                have_readers = true;
            }
            const bool add = node->op == GGML_OP_ADD;
            const int mul_at = fuse_norm(ctx, graph, add ? i : -1, norm_at, readers);
            if (mul_at >= 0) {
                fused += add ? 2 : 1;
                i = mul_at;
            }
        } else if (is_plain_product(node)) {
            const size_t groups = ctx->fusions.groups.size();
            i = fuse_products(ctx, graph, i);
            if (ctx->fusions.groups.size() > groups) fused += ctx->fusions.groups.back().n - 1;
        }
    }
    g_fused_nodes.fetch_add((uint64_t)fused, std::memory_order_relaxed);
}

void set_fusion(bool on) { g_fusion.store(on, std::memory_order_relaxed); }
uint64_t fused_nodes() { return g_fused_nodes.load(std::memory_order_relaxed); }

}  // namespace stackd::backend_detail
