// libstackd_kernels_check.so, loaded by tests and bench/ only (testing/kernels_check.py):
// the op-level self-check the tests drive (tests/kernels/test_ops.py) and the op benchmark
// (bench/kernels_ops.py) times, our MUL_MAT against ggml's own CPU backend on the same random
// Q4_1 or Q8_0 weights and activations through ggml's public graph API on both sides; and
// the device's answers to the questions the tests ask.
//
// This library holds its own copy of the kernels (the same objects as libstackd_kernels.so)
// and makes its own backends; it registers nothing. What it reports of the device the process
// registered (stackd_kernels_get_rows_nodes) it asks through ggml's registry.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <omp.h>

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
    std::string name;           // the weight's name ("": none; backend.cpp picks the chunked form by it)
};

Problem make_problem(ggml_type type, int64_t k, int64_t rows, int64_t tokens, uint32_t seed) {
    Problem p{type, k, rows, tokens, {}, {}, {}};
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

// Computes the graph of `node` on a backend `repeat` times; *seconds (if asked): the fastest.
void compute(ggml_backend_t backend, ggml_context *ctx, ggml_tensor *node, int repeat, double *seconds) {
    ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, node);
    double best = 1e30;
    for (int i = 0; i < repeat; i++) {
        const auto start = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend, graph);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (seconds) *seconds = best;
}

// Runs mul_mat(weights, x[first .. first+count)) on a backend, the weight in weight_buft.
// Returns the output (count x rows) and the seconds of the fastest of `repeat` runs.
std::vector<float> run(const Problem &p, int64_t first, int64_t count, ggml_backend_t backend,
                       ggml_backend_buffer_type_t weight_buft, int repeat, double *seconds) {
    ggml_init_params params = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *w = ggml_new_tensor_2d(ctx, p.type, p.k, p.rows);
    if (!p.name.empty()) ggml_set_name(w, p.name.c_str());
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, weight_buft);
    ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, p.k, count);
    ggml_tensor *y = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(w, p.w.data(), 0, p.w.size());
    ggml_backend_tensor_set(x, p.x.data() + first * p.k, 0, ggml_nbytes(x));
    compute(backend, ctx, y, repeat, seconds);
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

// Q5_1: |d_w d_a| sum|q_w q_a| + |m_w s_a|, q_w in 0..31.
double block_magnitude(const block_q5_1 &wb, const ActBlock &a) {
    uint32_t qh;
    std::memcpy(&qh, wb.qh, sizeof qh);
    int64_t dot = 0;
    for (int i = 0; i < 16; i++) {
        const int lo = (wb.qs[i] & 0x0F) | ((qh >> i) & 1) << 4, hi = (wb.qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4;
        dot += lo * std::abs((int)a.q[i]) + hi * std::abs((int)a.q[i + 16]);
    }
    return std::fabs((double)ggml_fp16_to_fp32(q5_1_d(wb)) * a.d) * dot +
           std::fabs((double)ggml_fp16_to_fp32(q5_1_m(wb)) * a.s);
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

namespace {

void check_problem(const Problem &p, int path, int n_threads, double *result);

}  // namespace

// result[0]: max over outputs of |ours - ggml| / magnitude (see magnitudes())
// result[1]: max |ours - ggml| / max |ggml|
// result[2]: 1 if the first, a middle and the last token computed alone equal the batch bit for bit
// result[3]: 1 if reading the repacked weight back gives ggml's bytes unchanged
// result[4]: 1 if the output equals the scalar reference path's bit for bit
// type: a ggml_type we repack (Q4_1, Q8_0). Returns 0, or -1 if this CPU cannot run the path.
STACKD_API int stackd_kernels_check(int type, int64_t k, int64_t rows, int64_t tokens, int path,
                                    uint32_t seed, int n_threads, double *result) {
    if (!runnable(type, path)) return -1;
    check_problem(make_problem((ggml_type)type, k, rows, tokens, seed), path, n_threads, result);
    return 0;
}

// The same checks (result[0..4]) on a product in the chunked form (kernels.h, GemmOut): the
// weight named as a layer's ffn_down, whose run backend.cpp derives from K (chunk_run_for). result[5]:
// 1 if its output differs from the plain form's somewhere (the name took effect); result[6]: 1
// if with runs at least K long (k <= 256) it equals the plain form's bit for bit.
STACKD_API int stackd_kernels_check_chunked(int type, int64_t k, int64_t rows, int64_t tokens, int path,
                                            uint32_t seed, int n_threads, double *result) {
    if (!runnable(type, path)) return -1;
    Problem p = make_problem((ggml_type)type, k, rows, tokens, seed);
    ggml_backend_t ours = backend_new((Path)path);
    set_threads(ours, n_threads);
    const auto plain = run(p, 0, tokens, ours, repack_buffer_type(), 1, nullptr);
    p.name = "blk.0.ffn_down.weight";
    const auto chunked = run(p, 0, tokens, ours, repack_buffer_type(), 1, nullptr);
    ggml_backend_free(ours);
    const bool same = std::memcmp(plain.data(), chunked.data(), plain.size() * sizeof(float)) == 0;
    result[5] = !same;
    result[6] = same;
    check_problem(p, path, n_threads, result);
    return 0;
}

namespace {

void check_problem(const Problem &p, int path, int n_threads, double *result) {
    const int64_t k = p.k, rows = p.rows, tokens = p.tokens;
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_t ours = backend_new((Path)path);
    set_threads(cpu, n_threads);
    set_threads(ours, n_threads);

    const auto ref = run(p, 0, tokens, cpu, ggml_backend_cpu_buffer_type(), 1, nullptr);
    const auto got = run(p, 0, tokens, ours, repack_buffer_type(), 1, nullptr);
    const auto mag = p.type == GGML_TYPE_Q8_0   ? magnitudes<block_q8_0>(p)
                     : p.type == GGML_TYPE_Q4_0 ? magnitudes<block_q4_0>(p)
                     : p.type == GGML_TYPE_Q5_0 ? magnitudes<block_q5_0>(p)
                     : p.type == GGML_TYPE_Q5_1 ? magnitudes<block_q5_1>(p)
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
}

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

// The run backend.cpp gives a whole attn_output (attn 1) or ffn_down (attn 0) weight of K k:
// tests hold server/engine/accel.py's copy of the rule to it.
STACKD_API int64_t stackd_kernels_run_for(int attn, int64_t k) { return chunk_run_for(attn != 0, k); }

// Whether quantize_row_k, on the path this CPU runs, gives quantize_row_k_scalar's bytes for the
// k floats at x (k a multiple of 256): 1 if every byte of every super-block is the same.
STACKD_API int stackd_kernels_quantize_k_matches(const float *x, int64_t k) {
    const int64_t nb = k / kQK_K;
    std::vector<ActKBlock> simd(nb), scalar(nb);
    quantize_row_k(x, k, simd.data());
    quantize_row_k_scalar(x, k, scalar.data());
    return std::memcmp(simd.data(), scalar.data(), nb * sizeof(ActKBlock)) == 0;
}

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

// ---- Decode attention (attention.h) ----

namespace {

// A FLASH_ATTN_EXT problem shaped as llama.cpp's non-unified KV cache builds it: n_streams
// sequences of `tokens` query rows each, every stream's own n_kv cells. Stream i holds
// length[i] cells; its row t sees the cells before length[i] - tokens + 1 + t (causal), less a
// few holes (masked cells inside, as a cache with removed tokens has). In memory, as llama.cpp's
// cache holds it, a cell's row has every K/V head side by side (heads_in_row; the node's K and V
// are permuted views of it), or, the other layout ggml allows, each head's cells are contiguous.
struct AttentionProblem {
    int64_t dk, dv, n_kv, tokens, n_head, n_head_kv, n_streams;
    ggml_type kv_type;                      // F16 or Q8_0
    bool heads_in_row;
    std::vector<float> q;                   // dk x tokens x n_head x n_streams
    std::vector<uint8_t> k, v;              // rows of kv_type: dk|dv x n_kv x n_head_kv x n_streams
    std::vector<float> k_values, v_values;  // the same, as floats (what the rows hold exactly)
    std::vector<ggml_fp16_t> mask;          // n_kv x tokens x 1 x n_streams
    float scale;
    size_t k_row() const { return ggml_row_size(kv_type, dk); }
    size_t v_row() const { return ggml_row_size(kv_type, dv); }
};

// Random values of a cache in `type`: the rows, and what they hold as floats.
void fill_cache(ggml_type type, int64_t d, int64_t rows, std::mt19937 &rng, std::vector<uint8_t> &bytes,
                std::vector<float> &values) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(d * rows);
    for (auto &e : x) e = normal(rng);
    bytes.resize(ggml_row_size(type, d) * rows);
    ggml_quantize_chunk(type, x.data(), bytes.data(), 0, rows, d, nullptr);
    values.resize(d * rows);
    ggml_get_type_traits(type)->to_float(bytes.data(), values.data(), d * rows);
}

AttentionProblem make_attention(int64_t dk, int64_t dv, int64_t n_kv, int64_t tokens, int64_t n_head,
                                int64_t n_head_kv, int64_t n_streams, ggml_type kv_type, bool heads_in_row,
                                uint32_t seed) {
    AttentionProblem p{dk, dv, n_kv, tokens, n_head, n_head_kv, n_streams, kv_type, heads_in_row, {}, {}, {}, {}, {}, {},
                       1.0f / std::sqrt((float)dk)};
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    p.q.resize(dk * tokens * n_head * n_streams);
    for (auto &x : p.q) x = 2.0f * normal(rng);
    fill_cache(kv_type, dk, n_kv * n_head_kv * n_streams, rng, p.k, p.k_values);
    fill_cache(kv_type, dv, n_kv * n_head_kv * n_streams, rng, p.v, p.v_values);
    p.mask.assign(n_kv * tokens * n_streams, ggml_fp32_to_fp16(-INFINITY));
    std::uniform_int_distribution<int64_t> length_of(std::min<int64_t>(tokens, n_kv), n_kv);
    for (int64_t s = 0; s < n_streams; s++) {
        const int64_t length = length_of(rng);
        for (int64_t t = 0; t < tokens; t++) {
            const int64_t seen = length - tokens + 1 + t;
            for (int64_t c = 0; c < seen; c++)
                if (c % 37 != 5) p.mask[(s * tokens + t) * n_kv + c] = ggml_fp32_to_fp16(0.0f);
        }
    }
    return p;
}

// The problem's streams [first, first + count) through a backend's FLASH_ATTN_EXT, the view
// `extra` cells longer than the problem's (masked: as a step whose longest stream is longer).
// Output: dv x n_head x tokens x count.
std::vector<float> run_attention(const AttentionProblem &p, int64_t first, int64_t count, int64_t extra,
                                 ggml_backend_t backend, int repeat, double *seconds) {
    const int64_t n_kv = p.n_kv + extra;
    ggml_init_params params = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, p.dk, p.tokens, p.n_head, count);
    ggml_tensor *k, *v;
    if (p.heads_in_row) {
        k = ggml_new_tensor_4d(ctx, p.kv_type, p.dk, p.n_head_kv, n_kv, count);
        v = ggml_new_tensor_4d(ctx, p.kv_type, p.dv, p.n_head_kv, n_kv, count);
    } else {
        k = ggml_new_tensor_4d(ctx, p.kv_type, p.dk, n_kv, p.n_head_kv, count);
        v = ggml_new_tensor_4d(ctx, p.kv_type, p.dv, n_kv, p.n_head_kv, count);
    }
    ggml_tensor *mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, p.tokens, 1, count);
    ggml_tensor *k_view = p.heads_in_row ? ggml_permute(ctx, k, 0, 2, 1, 3) : k;
    ggml_tensor *v_view = p.heads_in_row ? ggml_permute(ctx, v, 0, 2, 1, 3) : v;
    ggml_tensor *out = ggml_flash_attn_ext(ctx, q, k_view, v_view, mask, p.scale, 0.0f, 0.0f);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(q, p.q.data() + first * p.dk * p.tokens * p.n_head, 0, ggml_nbytes(q));
    const ggml_fp16_t masked = ggml_fp32_to_fp16(-INFINITY);
    std::vector<uint8_t> kk(ggml_nbytes(k), 0), vv(ggml_nbytes(v), 0);  // zero bytes: 0.0 in either type
    std::vector<ggml_fp16_t> mm(ggml_nelements(mask), masked);
    for (int64_t s = 0; s < count; s++)
        for (int64_t h = 0; h < p.n_head_kv; h++)
            for (int64_t c = 0; c < p.n_kv; c++) {
                const int64_t from = ((first + s) * p.n_head_kv + h) * p.n_kv + c;
                const int64_t to = p.heads_in_row ? (s * n_kv + c) * p.n_head_kv + h : (s * p.n_head_kv + h) * n_kv + c;
                std::copy_n(p.k.begin() + from * p.k_row(), p.k_row(), kk.begin() + to * p.k_row());
                std::copy_n(p.v.begin() + from * p.v_row(), p.v_row(), vv.begin() + to * p.v_row());
            }
    for (int64_t s = 0; s < count; s++)
        for (int64_t t = 0; t < p.tokens; t++)
            std::copy_n(p.mask.begin() + ((first + s) * p.tokens + t) * p.n_kv, p.n_kv,
                        mm.begin() + (s * p.tokens + t) * n_kv);
    ggml_backend_tensor_set(k, kk.data(), 0, ggml_nbytes(k));
    ggml_backend_tensor_set(v, vv.data(), 0, ggml_nbytes(v));
    ggml_backend_tensor_set(mask, mm.data(), 0, ggml_nbytes(mask));
    compute(backend, ctx, out, repeat, seconds);
    std::vector<float> result(ggml_nelements(out));
    ggml_backend_tensor_get(out, result.data(), 0, ggml_nbytes(out));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return result;
}

// ggml's CPU backend on its one-row-at-a-time path (use_ref), as llama.cpp's decode steps run it.
ggml_backend_t ggml_per_row_backend(int n_threads) {
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    set_threads(cpu, n_threads);
    using SetUseRef = void (*)(ggml_backend_t, bool);
    auto set_use_ref = (SetUseRef)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(ggml_backend_get_device(cpu)), "ggml_backend_cpu_set_use_ref");
    if (set_use_ref) set_use_ref(cpu, true);
    return cpu;
}

// Per output value: the exact result (double, from the cache's values and the f16-rounded
// query), and the bound attention.h's arithmetic keeps ours within (kernels/README.md,
// "Decode attention"): with u = 2^-24, a score's error is at most (dk/16 + 6) u (scale
// sum|q k| + |s|), which moves its probability by that much relatively; each block adds a
// rescaling, the sums and the multiply-adds add (4 n_blocks + n_live + 8) u; all of it at most
// twice over sum p|v| / sum p. The bound for ggml adds, on an f16 cache, its f16 accumulator's
// 2^-11 per cell; on a q8_0 cache, its query quantized to q8_0 (each value off by at most half
// its block's step, and the f16 rounding ours makes), twice over as for the scores.
struct Exact {
    std::vector<double> value, ours, ggml;
};

Exact exact_attention(const AttentionProblem &p) {
    const double u = std::ldexp(1.0, -24);
    const int64_t group = p.n_head / p.n_head_kv, n_blocks = (p.n_kv + 15) / 16;
    Exact e;
    const int64_t n_out = p.dv * p.n_head * p.tokens * p.n_streams;
    e.value.resize(n_out);
    e.ours.resize(n_out);
    e.ggml.resize(n_out);
    std::vector<double> s(p.n_kv), pr(p.n_kv);
    for (int64_t st = 0; st < p.n_streams; st++)
        for (int64_t t = 0; t < p.tokens; t++)
            for (int64_t h = 0; h < p.n_head; h++) {
                const float *q = p.q.data() + ((st * p.n_head + h) * p.tokens + t) * p.dk;
                const int64_t hk = h / group;
                double m = -INFINITY, score_error = 0, ggml_score_error = 0;
                int64_t n_live = 0;
                for (int64_t c = 0; c < p.n_kv; c++) {
                    const ggml_fp16_t mv = p.mask[(st * p.tokens + t) * p.n_kv + c];
                    s[c] = -INFINITY;
                    if (ggml_fp16_to_fp32(mv) == -INFINITY) continue;
                    const float *k = p.k_values.data() + ((st * p.n_head_kv + hk) * p.n_kv + c) * p.dk;
                    double dot = 0, magnitude = 0, quantized = 0;
                    for (int64_t d = 0; d < p.dk; d++) {
                        const double qd = ggml_fp16_to_fp32(ggml_fp32_to_fp16(q[d]));
                        dot += qd * k[d];
                        magnitude += std::fabs(qd * k[d]);
                        float amax = 0;
                        for (int64_t i = d / 32 * 32; i < d / 32 * 32 + 32; i++) amax = std::max(amax, std::fabs(q[i]));
                        quantized += std::fabs(k[d]) * (amax / 127.0 / 2 + std::ldexp(std::fabs(q[d]), -11));
                    }
                    s[c] = dot * p.scale + ggml_fp16_to_fp32(mv);
                    score_error = std::max(score_error, (p.dk / 16 + 6) * u * (p.scale * magnitude + std::fabs(s[c])));
                    ggml_score_error = std::max(ggml_score_error, p.scale * quantized);
                    m = std::max(m, s[c]);
                    n_live++;
                }
                double sum = 0;
                for (int64_t c = 0; c < p.n_kv; c++) sum += pr[c] = s[c] == -INFINITY ? 0.0 : std::exp(s[c] - m);
                const double rel = 2 * (score_error + (4 * n_blocks + n_live + 8) * u);
                for (int64_t d = 0; d < p.dv; d++) {
                    double value = 0, weight = 0;
                    for (int64_t c = 0; c < p.n_kv; c++) {
                        if (pr[c] == 0) continue;
                        const double vd = p.v_values[((st * p.n_head_kv + hk) * p.n_kv + c) * p.dv + d];
                        value += pr[c] * vd;
                        weight += pr[c] * std::fabs(vd);
                    }
                    const int64_t i = ((st * p.tokens + t) * p.n_head + h) * p.dv + d;
                    e.value[i] = sum > 0 ? value / sum : 0;
                    e.ours[i] = sum > 0 ? rel * weight / sum : 0;
                    const double ggml_rel = p.kv_type == GGML_TYPE_F16 ? (n_live + 2) * std::ldexp(1.0, -11)
                                                                        : 2 * ggml_score_error + (n_live + 8) * u;
                    e.ggml[i] = e.ours[i] + (sum > 0 ? ggml_rel * weight / sum : 0);
                }
            }
    return e;
}

}  // namespace

// Our decode attention on `path` against the exact result and ggml's per-row path:
// result[0]: max over outputs of |ours - exact| / our bound (exact_attention): at most 1
// result[1]: max |ours - ggml| / (our bound + ggml's f16 accumulator's)
// result[2]: 1 if the first and last streams computed alone, in a view 48 cells longer, equal the
//            batch's bit for bit
// result[3]: 1 if the output equals the scalar path's bit for bit
// result[4]: 1 if the node ran on our kernel (0: ggml computed it: shapes we do not take)
// Returns 0, or -1 if this CPU cannot run the path.
STACKD_API int stackd_kernels_check_attention(int64_t dk, int64_t dv, int64_t n_kv, int64_t tokens, int64_t n_head,
                                              int64_t n_head_kv, int64_t n_streams, int kv_type, int heads_in_row,
                                              int path, uint32_t seed, int n_threads, double *result) {
    if (path < 0 || path >= kPathCount || !cpu_supports((Path)path)) return -1;
    const AttentionProblem p = make_attention(dk, dv, n_kv, tokens, n_head, n_head_kv, n_streams, (ggml_type)kv_type,
                                              heads_in_row != 0, seed);
    ggml_backend_t cpu = ggml_per_row_backend(n_threads);
    ggml_backend_t ours = backend_new((Path)path);
    set_threads(ours, n_threads);
    const auto ref = run_attention(p, 0, n_streams, 0, cpu, 1, nullptr);
    const uint64_t nodes_before = attention_nodes();
    const auto got = run_attention(p, 0, n_streams, 0, ours, 1, nullptr);
    result[4] = attention_nodes() == nodes_before + 1;
    const Exact exact = exact_attention(p);
    double worst = 0, worst_ggml = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double err = std::fabs((double)got[i] - exact.value[i]);
        const double rel = exact.ours[i] > 0 ? err / exact.ours[i] : (err > 0 ? INFINITY : 0.0);
        if (!(rel <= worst)) worst = std::isnan(rel) ? INFINITY : rel;
        const double diff = std::fabs((double)got[i] - ref[i]);
        const double rel_ggml = exact.ggml[i] > 0 ? diff / exact.ggml[i] : (diff > 0 ? INFINITY : 0.0);
        if (!(rel_ggml <= worst_ggml)) worst_ggml = std::isnan(rel_ggml) ? INFINITY : rel_ggml;
    }
    result[0] = worst;
    result[1] = worst_ggml;

    const int64_t per_stream = dv * n_head * tokens;
    bool invariant = true;
    for (int64_t s : {int64_t(0), n_streams - 1}) {
        const auto alone = run_attention(p, s, 1, 48, ours, 1, nullptr);
        invariant = invariant && std::memcmp(alone.data(), got.data() + s * per_stream, per_stream * sizeof(float)) == 0;
    }
    result[2] = invariant;

    ggml_backend_t scalar = backend_new(Path::Scalar);
    set_threads(scalar, n_threads);
    const auto reference = path == (int)Path::Scalar ? got : run_attention(p, 0, n_streams, 0, scalar, 1, nullptr);
    result[3] = std::memcmp(reference.data(), got.data(), got.size() * sizeof(float)) == 0;
    ggml_backend_free(scalar);

    ggml_backend_free(ours);
    ggml_backend_free(cpu);
    return 0;
}

// Seconds per FLASH_ATTN_EXT (best of `repeat`) of a decode step: ggml's per-row path
// (times[0]) and ours on `path` (times[1]). Returns 0, or -1 if this CPU cannot run the path.
STACKD_API int stackd_kernels_time_attention(int64_t dk, int64_t n_kv, int64_t tokens, int64_t n_head,
                                             int64_t n_head_kv, int64_t n_streams, int kv_type, int path,
                                             int n_threads, int repeat, double *times) {
    if (path < 0 || path >= kPathCount || !cpu_supports((Path)path)) return -1;
    const AttentionProblem p = make_attention(dk, dk, n_kv, tokens, n_head, n_head_kv, n_streams, (ggml_type)kv_type,
                                              true, 1);
    ggml_backend_t cpu = ggml_per_row_backend(n_threads);
    ggml_backend_t ours = backend_new((Path)path);
    set_threads(ours, n_threads);
    run_attention(p, 0, n_streams, 0, cpu, repeat, &times[0]);
    run_attention(p, 0, n_streams, 0, ours, repeat, &times[1]);
    ggml_backend_free(ours);
    ggml_backend_free(cpu);
    return 0;
}

// ---- the machine's memory read bandwidth (bench/roofline.py's memory roof) ----

namespace {

// Sums a slice as 64-bit words with eight independent chains, which the compiler vectorizes at
// the baseline's width: far more loads a cycle than DRAM feeds, so the loop waits on memory.
// Each cache line is asked for kReadAhead bytes early, as our kernels ask for their weights
// (prefetch.h): the hardware prefetcher alone leaves a thread well under what it can read.
constexpr size_t kReadAhead = 8192;

uint64_t read_slice(const uint64_t *p, size_t n) {
    uint64_t s[8] = {};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __builtin_prefetch(reinterpret_cast<const char *>(p + i) + kReadAhead, 0, 3);
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    }
    for (; i < n; i++) s[0] += p[i];
    uint64_t total = 0;
    for (const uint64_t v : s) total += v;
    return total;
}

}  // namespace

// Bytes a second that `n_threads` threads (OpenMP, as ggml's team) read from a buffer of
// `bytes` (far larger than the last-level cache: DRAM), best of `repeat` passes, each thread a
// contiguous share; the buffer is written first so that every page is committed. Returns 0.
STACKD_API int stackd_kernels_read_bandwidth(int64_t bytes, int n_threads, int repeat, double *bytes_per_second) {
    const size_t words = (size_t)bytes / sizeof(uint64_t);
    std::vector<uint64_t> buffer(words);
    for (size_t i = 0; i < words; i++) buffer[i] = i;
    double best = 0.0;
    volatile uint64_t sink = 0;
    for (int r = 0; r < repeat; r++) {
        uint64_t sum = 0;
        const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(n_threads) reduction(+ : sum)
        {
            const size_t nth = (size_t)omp_get_num_threads(), ith = (size_t)omp_get_thread_num();
            const size_t begin = words * ith / nth, end = words * (ith + 1) / nth;
            sum += read_slice(buffer.data() + begin, end - begin);
        }
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        sink = sink + sum;
        best = std::max(best, (double)(words * sizeof(uint64_t)) / seconds);
    }
    *bytes_per_second = best;
    return 0;
}

// ---- what a node costs ggml's team whatever its work (bench/roofline.py's barriers) ----

// Seconds per node (best of `repeat` graphs) of a chain of `n_nodes` additions of a 64-float
// tensor on ggml's CPU backend with `n_threads`: its dispatch and the barrier after it, the
// work nothing to speak of. Returns 0.
STACKD_API int stackd_kernels_time_nodes(int n_nodes, int n_threads, int repeat, double *seconds) {
    ggml_init_params params = {ggml_tensor_overhead() * (size_t)(n_nodes + 2) + ggml_graph_overhead(), nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64);
    ggml_tensor *y = x;
    n_nodes = std::clamp(n_nodes, 1, GGML_DEFAULT_GRAPH_SIZE - 2);
    for (int i = 0; i < n_nodes; i++) y = ggml_add(ctx, y, x);   // every thread takes part (ADD: n_threads tasks)
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    set_threads(cpu, n_threads);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
    ggml_backend_buffer_clear(buf, 0);
    double best;
    compute(cpu, ctx, y, repeat, &best);
    *seconds = best / n_nodes;
    ggml_backend_buffer_free(buf);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    return 0;
}
