// Decode attention's driver: which FLASH_ATTN_EXT nodes are ours, and how a node's query rows
// become tasks for the path's body (attention.h).
#include "attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace stackd {

namespace {

float op_param(const ggml_tensor *node, int i) {
    float x;
    std::memcpy(&x, (const float *)node->op_params + i, sizeof x);
    return x;
}

bool rows_contiguous(const ggml_tensor *t) { return t->nb[0] == ggml_type_size(t->type); }

// The node's shape, named as ggml's flash attention names it.
struct Shape {
    int64_t dk, dv, n_kv, n_tokens, n_head, n_streams;
    int64_t group;          // query heads per K/V head
    int64_t head_kv_count;  // K/V heads
    int64_t rows_per_unit;  // query rows sharing one K/V head in one stream: group x tokens

    explicit Shape(const ggml_tensor *node) {
        const ggml_tensor *q = node->src[0], *k = node->src[1], *v = node->src[2];
        dk = k->ne[0];
        dv = v->ne[0];
        n_kv = k->ne[1];
        n_tokens = q->ne[1];
        n_head = q->ne[2];
        n_streams = q->ne[3];
        head_kv_count = k->ne[2];
        group = n_head / head_kv_count;
        rows_per_unit = group * n_tokens;
    }
};

// Query rows per task: every row of a (stream, K/V head) unit when there are units enough for
// the threads to share evenly, fewer when there are not (one stream's decode: a row each).
int64_t rows_per_task(const Shape &s, int nth) {
    const int64_t units = s.n_streams * s.head_kv_count;
    const int64_t even = s.rows_per_unit * units / (4 * (int64_t)nth);
    return std::clamp<int64_t>(even, 1, std::min<int64_t>(s.rows_per_unit, kMaxTaskRows));
}

struct Scratch {
    std::vector<float> acc;
};

// The K/V stream query stream i3 reads (ggml broadcasts K and V over Q's streams).
int64_t kv_stream(const ggml_tensor *node, int64_t i3) { return i3 / (node->src[0]->ne[3] / node->src[1]->ne[3]); }

// Fills one task: stream i3, K/V head ik2, rows [row0, row0 + n) of that unit (row i is query
// head ik2 * group + i / n_tokens at token i % n_tokens).
void fill_task(const ggml_tensor *node, const Shape &s, float scale, int64_t i3, int64_t ik2, int64_t row0, int n,
               Scratch &scratch, AttentionTask &t) {
    const ggml_tensor *q = node->src[0], *k = node->src[1], *v = node->src[2], *mask = node->src[3];
    t.dk = s.dk;
    t.dv = s.dv;
    t.n_kv = s.n_kv;
    t.n_rows = n;
    t.scale = scale;
    const int64_t ik3 = kv_stream(node, i3);
    t.k = (const char *)k->data + ik2 * k->nb[2] + ik3 * k->nb[3];
    t.v = (const char *)v->data + ik2 * v->nb[2] + ik3 * v->nb[3];
    t.kv_type = k->type;
    t.k_stride = k->nb[1];
    t.v_stride = v->nb[1];
    scratch.acc.resize(n * s.dv);
    t.acc = scratch.acc.data();
    for (int r = 0; r < n; r++) {
        const int64_t i1 = (row0 + r) % s.n_tokens, i2 = ik2 * s.group + (row0 + r) / s.n_tokens;
        const auto *qrow = (const float *)((const char *)q->data + i1 * q->nb[1] + i2 * q->nb[2] + i3 * q->nb[3]);
        t.q[r] = qrow;
        t.mask[r] = mask == nullptr ? nullptr
                                    : (const uint16_t *)((const char *)mask->data + i1 * mask->nb[1] +
                                                         (i2 % mask->ne[2]) * mask->nb[2] +
                                                         (i3 % mask->ne[3]) * mask->nb[3]);
        // ggml's layout of the result: heads within a token, tokens within a stream
        t.out[r] = (float *)((char *)node->data + (i3 * node->ne[2] * node->ne[1] + i2 + i1 * node->ne[1]) * node->nb[1]);
    }
}

// A decode step reads each stream's cache once, and from memory: between steps the weights
// (~100 MB) push it out of every cache. Read as the tasks read it, a K/V head's rows a few
// hundred bytes apart and one cell at a time, it came in at ~5 GB/s a thread, and at 16 streams
// attention waited on memory three times as long as it computed (bench/README.md, "Roofline").
// So when the streams are enough to deal whole, a thread takes a stream's every K/V head, reads
// the stream's cache first in address order (sequential reads the hardware prefetchers follow,
// all heads' rows at once), then computes from its L2. Which thread computes a row changes no bit.

// Cells [0, extent) hold every cell the stream's rows see (its mask's last live cell + 1).
int64_t live_extent(const ggml_tensor *node, const Shape &s, int64_t i3) {
    const ggml_tensor *mask = node->src[3];
    if (mask == nullptr) return s.n_kv;
    int64_t extent = 0;
    for (int64_t i1 = 0; i1 < s.n_tokens; i1++) {
        const auto *m = (const uint16_t *)((const char *)mask->data + i1 * mask->nb[1] + (i3 % mask->ne[3]) * mask->nb[3]);
        int64_t last = s.n_kv;
        while (last > extent && m[last - 1] == kMaskedBits) last--;
        extent = std::max(extent, last);
    }
    return extent;
}

// Reads every cache line of the stream's K (or V) rows of cells [first, end), in address order
// (volatile: the values are not used, the reads are the point).
void read_rows(const ggml_tensor *t, int64_t ik3, int64_t first, int64_t end) {
    if (end <= first) return;
    const char *base = (const char *)t->data + ik3 * t->nb[3] + first * t->nb[1];
    const size_t row = ggml_row_size(t->type, t->ne[0]);
    auto read = [](const char *from, size_t bytes) {
        for (size_t b = 0; b < bytes; b += 64) (void)*(const volatile char *)(from + b);
    };
    if ((size_t)t->nb[2] * (t->ne[2] - 1) + row <= (size_t)t->nb[1]) {  // a cell's heads side by side
        read(base, (end - first - 1) * t->nb[1] + (t->ne[2] - 1) * t->nb[2] + row);
    } else {
        for (int64_t h = 0; h < t->ne[2]; h++) read(base + h * t->nb[2], (end - first - 1) * t->nb[1] + row);
    }
}

// The streams thread ith computes, longest first to the least loaded thread (every thread
// deals the same way from the same masks), or false when streams cannot be dealt whole: too
// few for the threads, or one longer than a thread's even share.
bool deal_streams(const ggml_tensor *node, const Shape &s, int ith, int nth, std::vector<int64_t> &mine,
                  std::vector<int64_t> &extents) {
    constexpr int kMaxThreads = 64;
    if (nth > kMaxThreads || s.n_streams < 2 * (int64_t)nth) return false;
    extents.resize(s.n_streams);
    int64_t total = 0;
    for (int64_t i3 = 0; i3 < s.n_streams; i3++) total += extents[i3] = live_extent(node, s, i3);
    thread_local std::vector<int64_t> order;
    order.resize(s.n_streams);
    for (int64_t i3 = 0; i3 < s.n_streams; i3++) order[i3] = i3;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return extents[a] > extents[b]; });
    if (extents[order[0]] * nth > total) return false;
    int64_t load[kMaxThreads] = {};
    mine.clear();
    for (int64_t i3 : order) {
        const int to = (int)(std::min_element(load, load + nth) - load);
        load[to] += extents[i3] + 1;
        if (to == ith) mine.push_back(i3);
    }
    return true;
}

// A decode step of one to three streams has too few (stream, K/V head) units for the threads, so
// a unit's query rows are split between tasks; dealt round robin, every thread then read every
// K/V head of the step for a row or two of it (a head's cache read once a row). Instead, when a
// unit's rows fit one task, the step's rows in (stream, head, row) order are cut into one run a
// thread, of even weight (a row weighs its stream's live cells), and a run is one task a unit
// it touches: each head is read by one thread once for all its rows (two at the seam between
// runs). A row's numbers do not depend on the rows beside it in its task.
bool deal_runs(ggml_tensor *node, const Shape &s, float scale, AttendFn attend, int ith, int nth, Scratch &scratch,
               std::vector<int64_t> &extents) {
    if (s.rows_per_unit > kMaxTaskRows) return false;
    extents.resize(s.n_streams);
    int64_t total = 0;
    for (int64_t i3 = 0; i3 < s.n_streams; i3++) {
        extents[i3] = live_extent(node, s, i3) + 1;  // + 1: a row of no live cell still costs its pass
        total += extents[i3] * s.head_kv_count * s.rows_per_unit;
    }
    // A head's rows are a few hundred bytes apart, and the heads of a cell side by side: read
    // head by head the prefetchers fetch the neighbours' lines too, so each thread first reads
    // its slice of cells of every stream, all heads, in address order (the cache read once
    // from memory, by both threads at once), and the runs then compute from the shared cache.
    for (int64_t i3 = 0; i3 < s.n_streams; i3++) {
        const int64_t ik3 = kv_stream(node, i3), cells = extents[i3] - 1;
        const int64_t first = cells * ith / nth, end = cells * (ith + 1) / nth;
        read_rows(node->src[1], ik3, first, end);
        read_rows(node->src[2], ik3, first, end);
    }
    // thread t's run: the rows whose weight before them is in [t * total / nth, (t + 1) * total / nth)
    const int64_t from = total * ith, to = total * (ith + 1);
    int64_t before = 0;
    AttentionTask task;
    for (int64_t i3 = 0; i3 < s.n_streams; i3++) {
        const int64_t w = extents[i3];
        for (int64_t ik2 = 0; ik2 < s.head_kv_count; ik2++, before += w * s.rows_per_unit) {
            // rows r of this unit with from <= (before + r * w) * nth < to
            auto first_at_least = [&](int64_t bound) {
                const int64_t need = bound - before * nth;   // r * w * nth >= need
                if (need <= 0) return (int64_t)0;
                return std::min<int64_t>(s.rows_per_unit, (need + w * nth - 1) / (w * nth));
            };
            const int64_t r0 = first_at_least(from), r1 = first_at_least(to);
            if (r1 <= r0) continue;
            fill_task(node, s, scale, i3, ik2, r0, (int)(r1 - r0), scratch, task);
            attend(task);
        }
    }
    return true;
}

}  // namespace

bool can_attend(const ggml_tensor *node) {
    if (node->op != GGML_OP_FLASH_ATTN_EXT) return false;
    const ggml_tensor *q = node->src[0], *k = node->src[1], *v = node->src[2], *mask = node->src[3];
    if (node->src[4] != nullptr) return false;  // sinks
    if (op_param(node, 1) != 0.0f || op_param(node, 2) != 0.0f) return false;  // ALiBi, soft-capping
    if (q->type != GGML_TYPE_F32 || k->type != v->type) return false;
    if (k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_Q8_0) return false;
    if (node->type != GGML_TYPE_F32 || node->nb[0] != sizeof(float)) return false;
    if (!rows_contiguous(q) || !rows_contiguous(k) || !rows_contiguous(v)) return false;
    if (k->ne[0] % kCellBlock != 0 || v->ne[0] % kCellBlock != 0) return false;
    if (k->ne[0] % ggml_blck_size(k->type) != 0 || v->ne[0] % ggml_blck_size(v->type) != 0) return false;
    if (k->ne[0] > kMaxHeadSize || v->ne[0] > kMaxHeadSize || q->ne[0] != k->ne[0]) return false;
    if (k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2] || k->ne[3] != v->ne[3]) return false;
    if (k->ne[2] == 0 || q->ne[2] % k->ne[2] != 0 || k->ne[3] == 0 || q->ne[3] % k->ne[3] != 0) return false;
    if (mask != nullptr && (mask->type != GGML_TYPE_F16 || !rows_contiguous(mask) || mask->ne[0] < k->ne[1]))
        return false;
    return true;
}

void attention_share(ggml_tensor *node, float scale, AttendFn attend, int ith, int nth) {
    const Shape s(node);
    const int64_t per_task = rows_per_task(s, nth);
    const int64_t tasks_per_unit = (s.rows_per_unit + per_task - 1) / per_task;
    thread_local Scratch scratch;
    thread_local std::vector<int64_t> mine, extents;
    AttentionTask task;
    if (tasks_per_unit == 1 && deal_streams(node, s, ith, nth, mine, extents)) {
        for (int64_t i3 : mine) {
            const int64_t ik3 = kv_stream(node, i3);
            read_rows(node->src[1], ik3, 0, extents[i3]);
            read_rows(node->src[2], ik3, 0, extents[i3]);
            for (int64_t ik2 = 0; ik2 < s.head_kv_count; ik2++) {
                fill_task(node, s, scale, i3, ik2, 0, (int)s.rows_per_unit, scratch, task);
                attend(task);
            }
        }
        return;
    }
    if (tasks_per_unit > 1 && deal_runs(node, s, scale, attend, ith, nth, scratch, extents)) return;
    const int64_t n_tasks = s.n_streams * s.head_kv_count * tasks_per_unit;
    for (int64_t i = ith; i < n_tasks; i += nth) {
        const int64_t unit = i / tasks_per_unit, row0 = (i % tasks_per_unit) * per_task;
        const int n = (int)std::min(per_task, s.rows_per_unit - row0);
        fill_task(node, s, scale, unit / s.head_kv_count, unit % s.head_kv_count, row0, n, scratch, task);
        attend(task);
    }
}

}  // namespace stackd
