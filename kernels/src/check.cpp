// libstackd_kernels_check.so, loaded by tests and bench/ only (tests/kernels/check_lib.py):
// the op-level self-check the tests drive (tests/kernels/test_ops.py) and the op benchmark
// (bench/kernels_ops.py) times, our MUL_MAT against ggml's own CPU backend on the same random
// Q4_1 or Q8_0 weights and activations through ggml's public graph API on both sides; and
// the device's answers to the questions the tests ask.
//
// This library holds its own copy of the kernels (the same objects as libstackd_kernels.so)
// and makes its own backends; it registers nothing. What it reports of the device the process
// registered (stackd_kernels_get_rows_nodes) it asks through ggml's registry.
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "kernels.h"
#include "layout.h"
#include "layout_qk.h"
#include "matmul.h"

#include "ggml_q4_1.h"

namespace stackd {

namespace {

struct Problem {
    ggml_type type;             // of the weights: Q4_1 or Q8_0
    int64_t k, rows, tokens;
    std::vector<uint8_t> w;     // rows x k, ggml's blocks of `type`
    std::vector<float> x;       // tokens x k
};

Problem make_problem(ggml_type type, int64_t k, int64_t rows, int64_t tokens, uint32_t seed) {
    Problem p{type, k, rows, tokens, {}, {}};
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> row_scale(0.01f, 0.1f), row_shift(-0.05f, 0.05f);
    std::vector<float> w(rows * k);
    for (int64_t r = 0; r < rows; r++) {
        const float scale = row_scale(rng), shift = row_shift(rng);
        for (int64_t i = 0; i < k; i++) w[r * k + i] = shift + scale * normal(rng);
    }
    p.w.resize(ggml_row_size(type, k) * rows);
    ggml_quantize_chunk(type, w.data(), p.w.data(), 0, rows, k, nullptr);
    p.x.resize(tokens * k);
    for (auto &v : p.x) v = normal(rng);
    for (int64_t t = 0; t < tokens; t++) p.x[t * k + (t * 7) % k] *= 20.0f;  // an outlier per token
    return p;
}

void set_threads(ggml_backend_t backend, int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    auto fn = (ggml_backend_set_n_threads_t)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads");
    if (fn) fn(backend, n_threads);
}

// Runs mul_mat(weights, x[first .. first+count)) on a backend, the weight in weight_buft.
// Returns the output (count x rows) and the seconds of the fastest of `repeat` runs.
std::vector<float> run(const Problem &p, int64_t first, int64_t count, ggml_backend_t backend,
                       ggml_backend_buffer_type_t weight_buft, int repeat, double *seconds) {
    ggml_init_params params = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *w = ggml_new_tensor_2d(ctx, p.type, p.k, p.rows);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, weight_buft);
    ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, p.k, count);
    ggml_tensor *y = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(w, p.w.data(), 0, p.w.size());
    ggml_backend_tensor_set(x, p.x.data() + first * p.k, 0, ggml_nbytes(x));
    ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, y);
    double best = 1e30;
    for (int i = 0; i < repeat; i++) {
        const auto start = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend, graph);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (seconds) *seconds = best;
    std::vector<float> out(count * p.rows);
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    ggml_backend_buffer_free(xbuf);
    ggml_backend_buffer_free(wbuf);
    ggml_free(ctx);
    return out;
}

// One block's |d_w d_a| sum|q_w q_a| (+ |m_w s_a| for Q4_1).
double block_magnitude(const block_q4_1 &wb, const ActBlock &a) {
    int64_t dot = 0;
    for (int i = 0; i < 16; i++) {
        dot += (wb.qs[i] & 0x0F) * std::abs((int)a.q[i]);
        dot += (wb.qs[i] >> 4) * std::abs((int)a.q[i + 16]);
    }
    return std::fabs((double)ggml_fp16_to_fp32(q4_1_d(wb)) * a.d) * dot +
           std::fabs((double)ggml_fp16_to_fp32(q4_1_m(wb)) * a.s);
}

// Q4_0 / Q5_0: |d_w d_a| sum|(q_w - 8 or 16) q_a|, q_w as ggml's dequantize_row reads it.
double block_magnitude(const block_q4_0 &wb, const ActBlock &a) {
    int64_t dot = 0;
    for (int i = 0; i < 16; i++) {
        dot += std::abs((wb.qs[i] & 0x0F) - 8) * std::abs((int)a.q[i]);
        dot += std::abs((wb.qs[i] >> 4) - 8) * std::abs((int)a.q[i + 16]);
    }
    return std::fabs((double)ggml_fp16_to_fp32(wb.d) * a.d) * dot;
}

double block_magnitude(const block_q5_0 &wb, const ActBlock &a) {
    uint32_t qh;
    std::memcpy(&qh, wb.qh, sizeof qh);
    int64_t dot = 0;
    for (int i = 0; i < 16; i++) {
        const int lo = (wb.qs[i] & 0x0F) | ((qh >> i) & 1) << 4, hi = (wb.qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4;
        dot += std::abs(lo - 16) * std::abs((int)a.q[i]) + std::abs(hi - 16) * std::abs((int)a.q[i + 16]);
    }
    return std::fabs((double)ggml_fp16_to_fp32(wb.d) * a.d) * dot;
}

double block_magnitude(const block_q8_0 &wb, const ActBlock &a) {
    int64_t dot = 0;
    for (int i = 0; i < kQK; i++) dot += std::abs((int)wb.qs[i]) * std::abs((int)a.q[i]);
    return std::fabs((double)ggml_fp16_to_fp32(wb.d) * a.d) * dot;
}

// Q4_K: per sub-block |d_w d_a| sc_s sum|q_w q_a| and |dmin_w d_a| m_s |bsum32_s| (ggml's
// get_scale_min_k4 decodes the 6-bit values). Q5_K: the same, q_w with its fifth bit (bit 2j,
// 2j + 1 of qh[l] for weight 64j + l, 64j + 32 + l: bit s of qh[l] for sub-block s).
int fifth_bit(const block_q4_K &, int, int) { return 0; }
int fifth_bit(const block_q5_K &wb, int s, int l) { return (wb.qh[l] >> s) & 1; }

template <class Block>
double q4k_magnitude(const Block &wb, const ActKBlock &a) {
    const uint8_t *q = wb.scales;
    const double d = std::fabs((double)ggml_fp16_to_fp32(wb.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.d) * a.d);
    const double dmin = std::fabs((double)ggml_fp16_to_fp32(wb.GGML_COMMON_AGGR_U.GGML_COMMON_AGGR_S.dmin) * a.d);
    double sum = 0;
    for (int s = 0; s < 8; s++) {
        const int sc = s < 4 ? q[s] & 63 : (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
        const int m = s < 4 ? q[s + 4] & 63 : (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
        int64_t dot = 0;
        for (int l = 0; l < 32; l++) {
            const int p = 64 * (s / 2) + 32 * (s % 2) + l;
            const int value = ((wb.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF) | fifth_bit(wb, s, l) << 4;
            dot += value * std::abs((int)a.q[p]);
        }
        sum += d * sc * dot + dmin * m * std::abs((int)a.bsum32[s]);
    }
    return sum;
}

double block_magnitude(const block_q4_K &wb, const ActKBlock &a) { return q4k_magnitude(wb, a); }
double block_magnitude(const block_q5_K &wb, const ActKBlock &a) { return q4k_magnitude(wb, a); }

// Q6_K: per 16-weight sub-block |d_w d_a| |sc_s| sum|(q_w - 32) q_a|.
double block_magnitude(const block_q6_K &wb, const ActKBlock &a) {
    const double d = std::fabs((double)ggml_fp16_to_fp32(wb.d) * a.d);
    double sum = 0;
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = wb.ql + 64 * n, *qh = wb.qh + 32 * n;
        for (int l = 0; l < 32; l++) {
            const int q[4] = {(ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4, (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
                              (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4, (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
            for (int e = 0; e < 4; e++) {
                const int p = 128 * n + 32 * e + l;
                sum += d * std::abs((int)wb.scales[p / 16]) * std::abs(q[e] - 32) * std::abs((int)a.q[p]);
            }
        }
    }
    return sum;
}

void quantize_any(const float *x, int64_t k, ActBlock *out) { quantize_row(x, k, out); }
void quantize_any(const float *x, int64_t k, ActKBlock *out) { quantize_row_k(x, k, out); }

// Sum over blocks of block_magnitude: the size of the terms both sides add up, the
// yardstick for rounding error (any order of summing has error <= n u * this).
template <class Block, class Act = ActBlock>
std::vector<double> magnitudes(const Problem &p) {
    const int64_t nb = p.k / (int64_t)sizeof(Act::q);
    const auto *w = reinterpret_cast<const Block *>(p.w.data());
    std::vector<Act> act(p.tokens * nb);
    for (int64_t t = 0; t < p.tokens; t++) quantize_any(p.x.data() + t * p.k, p.k, act.data() + t * nb);
    std::vector<double> mag(p.tokens * p.rows);
    for (int64_t t = 0; t < p.tokens; t++) {
        for (int64_t r = 0; r < p.rows; r++) {
            double sum = 0;
            for (int64_t b = 0; b < nb; b++) sum += block_magnitude(w[r * nb + b], act[t * nb + b]);
            mag[t * p.rows + r] = sum;
        }
    }
    return mag;
}

bool runnable(int type, int path) {
    return is_repacked_type((ggml_type)type) && path >= 0 && path < kPathCount && cpu_supports((Path)path);
}

}  // namespace

}  // namespace stackd

using namespace stackd;

// result[0]: max over outputs of |ours - ggml| / magnitude (see magnitudes())
// result[1]: max |ours - ggml| / max |ggml|
// result[2]: 1 if the first, a middle and the last token computed alone equal the batch bit for bit
// result[3]: 1 if reading the repacked weight back gives ggml's bytes unchanged
// result[4]: 1 if the output equals the scalar reference path's bit for bit
// type: a ggml_type we repack (Q4_1, Q8_0). Returns 0, or -1 if this CPU cannot run the path.
STACKD_API int stackd_kernels_check(int type, int64_t k, int64_t rows, int64_t tokens, int path,
                                    uint32_t seed, int n_threads, double *result) {
    if (!runnable(type, path)) return -1;
    const Problem p = make_problem((ggml_type)type, k, rows, tokens, seed);
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_t ours = backend_new((Path)path);
    set_threads(cpu, n_threads);
    set_threads(ours, n_threads);

    const auto ref = run(p, 0, tokens, cpu, ggml_backend_cpu_buffer_type(), 1, nullptr);
    const auto got = run(p, 0, tokens, ours, repack_buffer_type(), 1, nullptr);
    const auto mag = p.type == GGML_TYPE_Q8_0   ? magnitudes<block_q8_0>(p)
                     : p.type == GGML_TYPE_Q4_0 ? magnitudes<block_q4_0>(p)
                     : p.type == GGML_TYPE_Q5_0 ? magnitudes<block_q5_0>(p)
                     : p.type == GGML_TYPE_Q4_K ? magnitudes<block_q4_K, ActKBlock>(p)
                     : p.type == GGML_TYPE_Q5_K ? magnitudes<block_q5_K, ActKBlock>(p)
                     : p.type == GGML_TYPE_Q6_K ? magnitudes<block_q6_K, ActKBlock>(p)
                                                : magnitudes<block_q4_1>(p);
    double worst = 0, worst_abs = 0, ref_max = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double err = std::fabs((double)got[i] - ref[i]);
        const double rel = mag[i] > 0 ? err / mag[i] : (err > 0 ? INFINITY : 0.0);
        if (!(rel <= worst)) worst = std::isnan(rel) ? INFINITY : rel;  // a NaN output fails
        worst_abs = std::max(worst_abs, err);
        ref_max = std::max(ref_max, std::fabs((double)ref[i]));
    }
    result[0] = worst;
    result[1] = ref_max > 0 ? worst_abs / ref_max : worst_abs;

    bool invariant = true;
    for (int64_t t : {int64_t(0), tokens / 2, tokens - 1}) {
        const auto alone = run(p, t, 1, ours, repack_buffer_type(), 1, nullptr);
        invariant = invariant && std::memcmp(alone.data(), got.data() + t * rows, rows * sizeof(float)) == 0;
    }
    result[2] = invariant;

    ggml_backend_t scalar = backend_new(Path::Scalar);
    set_threads(scalar, n_threads);
    const auto reference = path == (int)Path::Scalar ? got : run(p, 0, tokens, scalar, repack_buffer_type(), 1, nullptr);
    result[4] = std::memcmp(reference.data(), got.data(), got.size() * sizeof(float)) == 0;
    ggml_backend_free(scalar);

    ggml_init_params params = {ggml_tensor_overhead(), nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *w = ggml_new_tensor_2d(ctx, p.type, k, rows);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, repack_buffer_type());
    ggml_backend_tensor_set(w, p.w.data(), 0, p.w.size());
    std::vector<uint8_t> back(p.w.size());
    ggml_backend_tensor_get(w, back.data(), 0, back.size());
    result[3] = back == p.w;
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);

    ggml_backend_free(ours);
    ggml_backend_free(cpu);
    return 0;
}

namespace {

// get_rows(table, ids) on a backend, the table in table_buft.
std::vector<float> run_get_rows(const Problem &p, const std::vector<int32_t> &ids, ggml_backend_t backend,
                                ggml_backend_buffer_type_t table_buft) {
    ggml_init_params params = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *w = ggml_new_tensor_2d(ctx, p.type, p.k, p.rows);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, table_buft);
    ggml_tensor *index = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, (int64_t)ids.size());
    ggml_tensor *y = ggml_get_rows(ctx, w, index);
    ggml_backend_buffer_t ibuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(w, p.w.data(), 0, p.w.size());
    ggml_backend_tensor_set(index, ids.data(), 0, ids.size() * sizeof(int32_t));
    ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, y);
    ggml_backend_graph_compute(backend, graph);
    std::vector<float> out(ids.size() * p.k);
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    ggml_backend_buffer_free(ibuf);
    ggml_backend_buffer_free(wbuf);
    ggml_free(ctx);
    return out;
}

}  // namespace

// GET_ROWS on a repacked table of `type` (Q8_0, Q4_K, Q6_K: get_rows.h) against ggml's CPU
// backend: `n_ids` row ids (the first and last row, a repeat, the rest random). Returns 1 when
// every float is ggml's bit for bit, else 0.
STACKD_API int stackd_kernels_check_get_rows(int type, int64_t k, int64_t rows, int64_t n_ids, uint32_t seed,
                                             int n_threads) {
    const Problem p = make_problem((ggml_type)type, k, rows, 1, seed);
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(n_ids);
    for (auto &id : ids) id = (int32_t)(rng() % rows);
    ids.front() = 0;
    ids.back() = (int32_t)(rows - 1);
    if (n_ids > 2) ids[1] = ids.back();
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_t ours = backend_new((Path)-1);
    set_threads(cpu, n_threads);
    set_threads(ours, n_threads);
    const auto ref = run_get_rows(p, ids, cpu, ggml_backend_cpu_buffer_type());
    const auto got = run_get_rows(p, ids, ours, repack_buffer_type());
    ggml_backend_free(ours);
    ggml_backend_free(cpu);
    return std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)) == 0 ? 1 : 0;
}

// Seconds per MUL_MAT (best of `repeat`) of rows x k weights of `type` against `tokens`
// tokens: times[0] ggml's CPU backend, times[1] ours on `path`. Returns 0, or -1 if the CPU
// lacks the path.
STACKD_API int stackd_kernels_time(int type, int64_t k, int64_t rows, int64_t tokens, int path,
                                   int n_threads, int repeat, double *times) {
    if (!runnable(type, path)) return -1;
    const Problem p = make_problem((ggml_type)type, k, rows, tokens, 1);
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_t ours = backend_new((Path)path);
    set_threads(cpu, n_threads);
    set_threads(ours, n_threads);
    run(p, 0, tokens, cpu, ggml_backend_cpu_buffer_type(), repeat, &times[0]);
    run(p, 0, tokens, ours, repack_buffer_type(), repeat, &times[1]);
    ggml_backend_free(ours);
    ggml_backend_free(cpu);
    return 0;
}

namespace {

// ggml's own repacked buffer type (CPU_REPACK: q4_0_8x8, q4_K_8x8, ... chosen for this CPU),
// which llama.cpp's loader puts weights in ahead of plain CPU memory; null when none.
ggml_backend_buffer_type_t ggml_repack_buffer_type() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    auto extra = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(cpu), "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t *buft = extra ? extra(cpu) : nullptr; buft && *buft; buft++)
        if (std::strcmp(ggml_backend_buft_name(*buft), "CPU_REPACK") == 0) return *buft;
    return nullptr;
}

// Whether ggml's CPU device takes a rows x k weight of `type` in that buffer for a MUL_MAT of
// `tokens` tokens (its repack covers this type and shape on this CPU).
bool ggml_repacks(ggml_backend_buffer_type_t buft, ggml_type type, int64_t k, int64_t rows, int64_t tokens) {
    ggml_init_params params = {ggml_tensor_overhead() * 4, nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *w = ggml_new_tensor_2d(ctx, type, k, rows);
    ggml_tensor *node = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, tokens));
    w->buffer = ggml_backend_buft_alloc_buffer(buft, 0);
    const bool ok = w->buffer != nullptr &&
                    ggml_backend_dev_supports_op(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), node);
    if (w->buffer) ggml_backend_buffer_free(w->buffer);
    ggml_free(ctx);
    return ok;
}

}  // namespace

// Seconds per MUL_MAT (best of `repeat`) on ggml's CPU backend with the weight in ggml's own
// repacked buffer (CPU_REPACK): the path llama.cpp runs, the speed peer for the types ggml
// repacks (Q4_0, Q4_K, ... on AVX2 and wider). Returns 0, or -1 when ggml does not repack
// this type or shape here.
STACKD_API int stackd_kernels_time_ggml_repacked(int type, int64_t k, int64_t rows, int64_t tokens, int n_threads,
                                                 int repeat, double *seconds) {
    ggml_backend_buffer_type_t buft = ggml_repack_buffer_type();
    if (buft == nullptr || !ggml_repacks(buft, (ggml_type)type, k, rows, tokens)) return -1;
    const Problem p = make_problem((ggml_type)type, k, rows, tokens, 1);
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    set_threads(cpu, n_threads);
    run(p, 0, tokens, cpu, buft, repeat, seconds);
    ggml_backend_free(cpu);
    return 0;
}

// Whether our device takes a weight of this type and shape for an op (0: MUL_MAT,
// 1: MUL_MAT_ID, 2: GET_ROWS), asked the way llama.cpp's loader asks: the op built on the
// weight placed in our buffer type, then the device's supports_op.
STACKD_API int stackd_kernels_accepts(int type, int64_t ne0, int64_t ne1, int64_t ne2, int op) {
    ggml_init_params params = {ggml_tensor_overhead() * 8, nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *w = ggml_new_tensor_3d(ctx, (ggml_type)type, ne0, ne1, ne2);
    ggml_tensor *node = nullptr;
    if (op == 0) {
        node = ggml_mul_mat(ctx, w, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ne0, 512, ne2));
    } else if (op == 1) {
        ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ne0, 2, 512);
        node = ggml_mul_mat_id(ctx, w, x, ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 512));
    } else {
        node = ggml_get_rows(ctx, w, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 512));
    }
    w->buffer = ggml_backend_buft_alloc_buffer(repack_buffer_type(), 0);
    const bool ok = ggml_backend_dev_supports_op(ggml_backend_reg_dev_get(backend_reg(), 0), node);
    ggml_backend_buffer_free(w->buffer);
    ggml_free(ctx);
    return ok;
}

// The path this CPU runs best (cpu_features.h's numbering, as server/engine/accel.py's PATHS).
STACKD_API int stackd_kernels_best_path() { return (int)best_path(); }

// How many GET_ROWS nodes the device registered in this process (by libstackd_kernels.so) has
// computed: tables of ours. 0 when none is registered.
STACKD_API uint64_t stackd_kernels_get_rows_nodes() {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name(ggml_backend_reg_name(backend_reg()));
    auto count = reg ? (GetRowsNodesFn)ggml_backend_reg_get_proc_address(reg, kGetRowsNodesProc) : nullptr;
    return count ? count() : 0;
}
