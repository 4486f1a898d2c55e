// A tensor split's part of our backend (tp.h; kernels/README.md, "Tensor parallelism"): the
// nodes backend.cpp's swap_in_tasks turns into exchanges while this process is in a group. The
// links, frames and exchanges themselves are tp_link.cpp's.
#include "backend_context.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "candidates_scan.h"
#include "matmul.h"
#include "profile.h"
#include "tp.h"

namespace stackd::backend_detail {

// ---- tensor parallelism (tp.h; kernels/README.md, "Tensor parallelism") ----
// While this process is in a tensor-parallel group, a graph's residual adds whose first operand
// is this node's partial sum (attn_output's, ffn_down's) exchange it with every peer first, and
// the vocabulary projection computes this rank's rows only, gathered to rank 0.

// Whether the graph running on this backend belongs to a tensor-parallel group that failed or
// was left meanwhile: ggml's abort callback then skips its remaining nodes.
bool tp_lost(const BackendContext *ctx) {
    const uint64_t generation = ctx->tp_generation.load(std::memory_order_relaxed);
    return generation != 0 && (tp::failed() || tp::generation() != generation);
}

namespace {

// Whether `a` is a GET_ROWS of rows of the chunked product whose sums `partial` holds, every
// row index in range (a last layer's output rows).
bool picks_rows_of_partial(const BackendContext *ctx, const ggml_tensor *a) {
    if (a->op != GGML_OP_GET_ROWS || a->src[0] != ctx->partial_of) return false;
    const ggml_tensor *from = a->src[0], *ids = a->src[1];
    if (ids->type != GGML_TYPE_I32 || !ggml_is_contiguous(ids) || a->ne[1] != ids->ne[0] || a->ne[0] != from->ne[0]) {
        return false;
    }
    const auto *rows = static_cast<const int32_t *>(ids->data);
    return std::all_of(rows, rows + ids->ne[0], [&](int32_t row) { return row >= 0 && row < from->ne[1]; });
}

// The partial sum the residual add `dst` exchanges, as doubles: the sums before rounding of the
// chunked product it adds (directly, or the rows a GET_ROWS picked of it: a last layer's
// output rows), else its first operand's floats widened (a product not ours: right within
// float rounding, but no longer one node's bits).
const double *partial_sum(BackendContext *ctx, const ggml_tensor *dst) {
    const ggml_tensor *a = dst->src[0];
    const size_t n = (size_t)ggml_nelements(dst);
    if (a == ctx->partial_of) return ctx->partial.data();
    ctx->partial_rows.resize(n);
    double *out = ctx->partial_rows.data();
    if (picks_rows_of_partial(ctx, a)) {
        const ggml_tensor *from = a->src[0];
        const auto *rows = static_cast<const int32_t *>(a->src[1]->data);
        const int64_t width = a->ne[0], stride = (int64_t)(from->nb[1] / sizeof(float));
        for (int64_t r = 0; r < a->ne[1]; r++) {
            std::memcpy(out + r * width, ctx->partial.data() + rows[r] * stride, sizeof(double) * (size_t)width);
        }
        return out;
    }
    const float *floats = static_cast<const float *>(a->data);
    for (size_t i = 0; i < n; i++) out[i] = floats[i];
    return out;
}

}  // namespace

// Thread 0 only (n_tasks 1); ggml's barrier after the node holds the others.
void allreduce_task(ggml_tensor *dst, int ith, int, void *userdata) {
    if (ith != 0) return;
    const profile::Scope timed(profile::kExchange, ith);
    auto *ctx = static_cast<BackendContext *>(userdata);
    tp::allreduce_add(partial_sum(ctx, dst), static_cast<const float *>(dst->src[1]->data),
                      static_cast<float *>(dst->data), (size_t)ggml_nelements(dst));
}

namespace {

// ---- a follower's top candidates of a row (tp::set_gather's candidates path) ----
// The order: by descending logit, equal logits by lower token, NaN as -inf (a NaN never wins
// llama.cpp's greedy pick but at token 0, which is the leader's). A scan keeps a buffer of what
// beat the k-th best so far: most logits are below it and cost one comparison (16 at a time on
// AVX-512, 8 on AVX2); when the buffer fills, it is cut back to the best k.

bool candidate_before(const tp::Candidate &a, const tp::Candidate &b) {
    return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

// The scan for the first logit above the floor: each ISA's in its own file (candidates_scan.h),
// chosen by the CPU, not by the kernels' path (a forced scalar path still scans with SIMD).
AboveFn above_fn() {
    static const AboveFn chosen = above_for(best_path());
    return chosen;
}

// Row x[0, n) (tokens begin + i): its k highest into out[0, k), in the order above; 1 <= k <= n.
// `buf` is scratch (4 k entries).
void select_candidates(const float *x, int64_t n, int64_t begin, int k, tp::Candidate *out,
                       std::vector<tp::Candidate> &buf) {
    const AboveFn above = above_fn();
    const size_t cap = 4 * (size_t)k;
    buf.clear();
    for (int64_t i = 0; i < k; i++) {
        buf.push_back({(int32_t)(begin + i), x[i] == x[i] ? x[i] : -INFINITY});
    }
    auto cut_back = [&] {   // the best k, sorted; the floor is the k-th
        std::partial_sort(buf.begin(), buf.begin() + k, buf.end(), candidate_before);
        buf.resize((size_t)k);
        return buf.back().logit;
    };
    float floor = cut_back();
    // a later index with the floor's logit ranks below the k-th (a higher token): only "above" gets in
    for (int64_t i = above(x, k, n, floor); i < n; i = above(x, i + 1, n, floor)) {
        buf.push_back({(int32_t)(begin + i), x[i]});
        if (buf.size() == cap) floor = cut_back();
    }
    cut_back();
    std::copy(buf.begin(), buf.end(), out);
}

}  // namespace

// Every thread computes its share of this rank's rows; then thread 0 gathers them to rank 0,
// a follower on the candidates path having picked each output row's candidates first (its
// threads a share of the rows each).
void logits_task(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const profile::Scope timed(profile::kLmHead, ith);
    auto *ctx = static_cast<BackendContext *>(userdata);
    int64_t begin = 0, end = 0;
    tp::vocab_rows(dst->ne[0], &begin, &end);   // checked when the node was swapped in
    mul_mat_share(dst, kernels_of(ctx), ctx->act, ctx->epoch, ith, nth, begin, end);
    float *logits = static_cast<float *>(dst->data);
    const size_t stride = dst->nb[1] / sizeof(float);
    const int k = (int)std::min<int64_t>(tp::gather_candidates(), end - begin);
    const bool pick = tp::rank() != 0 && k > 0;
#pragma omp barrier
    if (pick) {
        int64_t t0 = 0, t1 = 0;
        share(dst->ne[1], ith, nth, &t0, &t1);
        thread_local std::vector<tp::Candidate> buf;
        for (int64_t t = t0; t < t1; t++) {
            select_candidates(logits + t * stride + begin, end - begin, begin, k, ctx->candidates.data() + t * k, buf);
        }
#pragma omp barrier
    }
    if (ith == 0) tp::gather_logits(logits, dst->ne[1], stride, pick ? ctx->candidates.data() : nullptr);
}

// `ffn_inp-<il>` or `l_out-<il>`: llama.cpp's names (cb) for a layer's two residual adds.
bool residual_add_name(const char *name) {
    const char *digits = std::strncmp(name, "ffn_inp-", 8) == 0 ? name + 8
                       : std::strncmp(name, "l_out-", 6) == 0  ? name + 6
                                                               : nullptr;
    if (digits == nullptr || *digits == '\0') return false;
    for (; *digits; digits++) {
        if (*digits < '0' || *digits > '9') return false;
    }
    return true;
}

// "" when a residual add can be exchanged as it is, else why not.
std::string residual_add_problem(const ggml_tensor *node) {
    const ggml_tensor *a = node->src[0], *b = node->src[1];
    if (node->op != GGML_OP_ADD) return std::string("is a ") + ggml_op_name(node->op) + ", not an ADD";
    if (a == nullptr || b == nullptr || !ggml_are_same_shape(a, b) || !ggml_are_same_shape(a, node)) {
        return "adds tensors of different shapes";
    }
    if (a->type != GGML_TYPE_F32 || b->type != GGML_TYPE_F32 || node->type != GGML_TYPE_F32) return "is not f32";
    if (!ggml_is_contiguous(a) || !ggml_is_contiguous(b) || !ggml_is_contiguous(node)) return "is not contiguous";
    return "";
}

// "" when the vocabulary projection can be cut by rows, else why not.
std::string logits_problem(const BackendContext *ctx, const ggml_tensor *node) {
    int64_t begin, end;
    if (node->op != GGML_OP_MUL_MAT) return std::string("is a ") + ggml_op_name(node->op) + ", not a MUL_MAT";
    if (!ours(ctx, node)) {
        return std::string("is not on our kernels (its weight is ") + ggml_type_name(node->src[0]->type) +
               ", which we do not repack)";
    }
    if (node->ne[2] != 1 || node->ne[3] != 1 || node->nb[0] != sizeof(float) || node->nb[1] % sizeof(float) != 0) {
        return "has an output of an unexpected shape";
    }
    if (!tp::vocab_rows(node->ne[0], &begin, &end)) {
        return "has " + std::to_string(node->ne[0]) + " rows, where the group's vocab_cut ends elsewhere";
    }
    return "";
}

}  // namespace stackd::backend_detail
