// The path check: every SIMD path this CPU runs against the scalar path, bit for bit, for every
// format and op the backend takes (the Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K
// matmuls in both forms of the arithmetic, decode attention on f16 and q8_0 caches, the logits
// candidates' scan), and each token in a batch against the same token alone. It links the
// kernels' own sources and no ggml library (ggml_fp16.cpp gives ggml's two fp16 conversions
// from ggml's header), so it runs where no ggml is built: tests/kernels/test_aarch64.py
// cross-compiles it for aarch64 and runs it under qemu-aarch64 with several CPU models.
//
//     paths_check [--full]      prints the CPU's path, and a line per check that differs; exit 0:
//                               all equal (--full: more shapes, ~10,000 checks)
//     paths_check --self-test   the same comparison with one bit of each SIMD path's result
//                               flipped: must report it and exit 1 (the check can fail)
//
// The weights are random ggml blocks (random bytes, scales set to random normal fp16 values),
// repacked by the product's own layout code; the activations random floats with an outlier per
// token, quantized by the product's code. Equal means the same bytes (memcmp), so -0 and 0 or two
// NaNs would differ as well.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention.h"
#include "candidates_scan.h"
#include "cpu_features.h"
#include "kernels.h"
#include "kernels_qk.h"
#include "layout.h"
#include "layout_qk.h"

#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"

namespace stackd {
namespace {

std::mt19937 g_rng(20261201);
int g_failures = 0, g_checks = 0;
bool g_corrupt = false;   // --self-test: one bit of every SIMD path's first result flipped

void report(bool equal, const std::string &what) {
    g_checks++;
    if (!equal) {
        g_failures++;
        std::printf("DIFFERS %s\n", what.c_str());
    }
}

uint16_t random_half(float sigma) {
    std::normal_distribution<float> normal(0.0f, sigma);
    return ggml_fp32_to_fp16(normal(g_rng));
}

// A format: ggml's block bytes, where its fp16 fields sit, and our repack.
struct Format {
    const char *name;
    int64_t block_values, block_bytes;
    std::vector<int> half_offsets;   // the block's fp16 fields (scales, minimums)
    bool k_quant;
};

const Format kFormats[] = {
    {"q4_0", 32, sizeof(block_q4_0), {0}, false},
    {"q4_1", 32, sizeof(block_q4_1), {0, 2}, false},
    {"q5_0", 32, sizeof(block_q5_0), {0}, false},
    {"q5_1", 32, sizeof(block_q5_1), {0, 2}, false},
    {"q8_0", 32, sizeof(block_q8_0), {0}, false},
    {"q4_K", 256, sizeof(block_q4_K), {0, 2}, true},
    {"q5_K", 256, sizeof(block_q5_K), {0, 2}, true},
    {"q6_K", 256, sizeof(block_q6_K), {(int)offsetof(block_q6_K, d)}, true},
};

std::vector<uint8_t> random_blocks(const Format &f, int64_t rows, int64_t k) {
    const int64_t blocks = rows * (k / f.block_values);
    std::vector<uint8_t> plain(blocks * f.block_bytes);
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto &b : plain) b = (uint8_t)byte(g_rng);
    for (int64_t b = 0; b < blocks; b++)
        for (int offset : f.half_offsets) {
            const uint16_t h = random_half(0.05f);
            std::memcpy(plain.data() + b * f.block_bytes + offset, &h, 2);
        }
    return plain;
}

std::vector<float> random_activations(int64_t tokens, int64_t k) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(tokens * k);
    for (auto &v : x) v = normal(g_rng);
    for (int64_t t = 0; t < tokens; t++) x[t * k + (t * 7) % k] *= 20.0f;   // an outlier per token
    return x;
}

// The repacked weights, the quantized activations and one kernel call, for any format.
struct Problem {
    const Format *format;
    int64_t rows, k, tokens;
    std::vector<uint8_t> packed;
    std::vector<ActBlock> act;
    std::vector<ActKBlock> act_k;
};

Problem make_problem(const Format &f, int64_t rows, int64_t k, int64_t tokens) {
    Problem p{&f, rows, k, tokens, {}, {}, {}};
    const std::vector<uint8_t> plain = random_blocks(f, rows, k);
    const std::string name = f.name;
    const std::vector<float> x = random_activations(tokens, k);
    if (f.k_quant) {
        const int type = name == "q4_K" ? GGML_TYPE_Q4_K : name == "q5_K" ? GGML_TYPE_Q5_K : GGML_TYPE_Q6_K;
        p.packed.resize(repacked_size_k(type, rows, k));
        if (type == GGML_TYPE_Q4_K) repack_q4_k(plain.data(), rows, k, (Q4Kx8Block *)p.packed.data());
        if (type == GGML_TYPE_Q5_K) repack_q5_k(plain.data(), rows, k, (Q5Kx8Block *)p.packed.data());
        if (type == GGML_TYPE_Q6_K) repack_q6_k(plain.data(), rows, k, (Q6Kx8Block *)p.packed.data());
        p.act_k.resize(tokens * (k / kQK_K));
        for (int64_t t = 0; t < tokens; t++) quantize_row_k(x.data() + t * k, k, p.act_k.data() + t * (k / kQK_K));
    } else {
        const int64_t groups = row_groups(rows), nb = k / kQK;
        if (name == "q4_0") p.packed.resize(groups * nb * sizeof(Q40x8Block)), repack_q4_0(plain.data(), rows, k, (Q40x8Block *)p.packed.data());
        if (name == "q4_1") p.packed.resize(groups * nb * sizeof(Q4x8Block)), repack_q4_1(plain.data(), rows, k, (Q4x8Block *)p.packed.data());
        if (name == "q5_0") p.packed.resize(groups * nb * sizeof(Q50x8Block)), repack_q5_0(plain.data(), rows, k, (Q50x8Block *)p.packed.data());
        if (name == "q5_1") p.packed.resize(groups * nb * sizeof(Q51x8Block)), repack_q5_1(plain.data(), rows, k, (Q51x8Block *)p.packed.data());
        if (name == "q8_0") p.packed.resize(groups * nb * sizeof(Q8x8Block)), repack_q8_0(plain.data(), rows, k, (Q8x8Block *)p.packed.data());
        p.act.resize(tokens * nb);
        for (int64_t t = 0; t < tokens; t++) quantize_row(x.data() + t * k, k, p.act.data() + t * nb);
    }
    return p;
}

// Tokens [first, first + count) of the problem on a path's kernel, row groups [g0, g1) (a
// thread's share; all of them when g1 < 0), into out (count x rows floats, and doubles for the
// chunked form: chunk K-blocks a run, 0 the plain form).
void multiply(const Problem &p, const Kernels &kernels, int64_t first, int64_t count, int64_t chunk, int64_t g0,
              int64_t g1, std::vector<float> &f32, std::vector<double> &f64) {
    f32.assign(count * p.rows, NAN);
    f64.assign(count * p.rows, NAN);
    GemmOut out{f32.data(), chunk > 0 ? f64.data() : nullptr, p.rows, chunk};
    if (g1 < 0) g1 = row_groups(p.rows);
    const std::string name = p.format->name;
    const void *w = p.packed.data();
    if (p.format->k_quant) {
        const int64_t nb = p.k / kQK_K;
        const ActKBlock *a = p.act_k.data() + first * nb;
        if (name == "q4_K") kernels.kquants.q4_k((const Q4Kx8Block *)w, nb, p.rows, g0, g1, a, count, out);
        if (name == "q5_K") kernels.kquants.q5_k((const Q5Kx8Block *)w, nb, p.rows, g0, g1, a, count, out);
        if (name == "q6_K") kernels.kquants.q6_k((const Q6Kx8Block *)w, nb, p.rows, g0, g1, a, count, out);
        return;
    }
    const int64_t nb = p.k / kQK;
    const ActBlock *a = p.act.data() + first * nb;
    if (name == "q4_0") kernels.q4_0((const Q40x8Block *)w, nb, p.rows, g0, g1, a, count, out);
    if (name == "q4_1") kernels.q4_1((const Q4x8Block *)w, nb, p.rows, g0, g1, a, count, out);
    if (name == "q5_0") kernels.q5_0((const Q50x8Block *)w, nb, p.rows, g0, g1, a, count, out);
    if (name == "q5_1") kernels.q5_1((const Q51x8Block *)w, nb, p.rows, g0, g1, a, count, out);
    if (name == "q8_0") kernels.q8_0((const Q8x8Block *)w, nb, p.rows, g0, g1, a, count, out);
}

template <class T>
bool same_bytes(const std::vector<T> &a, const std::vector<T> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// One shape of one format: each path against scalar (plain and chunked forms, all rows at
// once and in two shares of row groups), and each token alone against its row in the batch.
void check_matmul(const Format &f, int64_t rows, int64_t k, int64_t tokens, const std::vector<Path> &paths) {
    const Problem p = make_problem(f, rows, k, tokens);
    const int64_t nb = k / f.block_values;
    const Kernels scalar = kernels_for(Path::Scalar);
    char shape[96];
    std::snprintf(shape, sizeof shape, "%s rows=%lld k=%lld tokens=%lld", f.name, (long long)rows, (long long)k,
                  (long long)tokens);
    for (int64_t chunk : {int64_t(0), nb > 1 ? nb / 2 : int64_t(1)}) {
        std::vector<float> want32, got32;
        std::vector<double> want64, got64;
        multiply(p, scalar, 0, tokens, chunk, 0, -1, want32, want64);
        for (Path path : paths) {
            const Kernels kernels = kernels_for(path);
            multiply(p, kernels, 0, tokens, chunk, 0, -1, got32, got64);
            if (g_corrupt) {
                uint32_t bits;
                std::memcpy(&bits, &got32[0], sizeof bits);
                bits ^= 1;
                std::memcpy(&got32[0], &bits, sizeof bits);
            }
            const std::string what = std::string(path_name(path)) + " vs scalar: " + shape + " chunk=" + std::to_string(chunk);
            report(same_bytes(want32, got32) && (chunk == 0 || same_bytes(want64, got64)), what);
            // two threads' shares of the row groups write the same rows
            const int64_t groups = row_groups(rows), half = groups / 2;
            std::vector<float> a32, b32;
            std::vector<double> a64, b64;
            multiply(p, kernels, 0, tokens, chunk, 0, half, a32, a64);
            multiply(p, kernels, 0, tokens, chunk, half, groups, b32, b64);
            bool equal = true;
            for (int64_t t = 0; t < tokens; t++)
                for (int64_t r = 0; r < rows; r++) {
                    const float v = r < half * kRowsPerGroup ? a32[t * rows + r] : b32[t * rows + r];
                    equal = equal && std::memcmp(&v, &want32[t * rows + r], sizeof v) == 0;
                }
            report(equal, what + " (in two shares of row groups)");
        }
        // batch invariance, on every path: token t alone gives its row of the batch
        std::vector<Path> all{Path::Scalar};
        all.insert(all.end(), paths.begin(), paths.end());
        for (Path path : all) {
            const Kernels kernels = kernels_for(path);
            multiply(p, kernels, 0, tokens, chunk, 0, -1, want32, want64);
            bool equal = true;
            for (int64_t t = 0; t < tokens; t++) {
                multiply(p, kernels, t, 1, chunk, 0, -1, got32, got64);
                equal = equal && std::memcmp(got32.data(), want32.data() + t * rows, rows * sizeof(float)) == 0;
            }
            report(equal, std::string(path_name(path)) + " token alone vs in the batch: " + shape +
                              " chunk=" + std::to_string(chunk));
        }
    }
}

// One attention shape: a task of n_rows query rows over n_kv cells, each path against scalar.
void check_attention(ggml_type type, int64_t dk, int64_t dv, int64_t n_kv, int n_rows, bool masked,
                     const std::vector<Path> &paths) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto row_bytes = [&](int64_t d) { return type == GGML_TYPE_F16 ? 2 * d : d / 32 * (int64_t)sizeof(block_q8_0); };
    const size_t k_stride = row_bytes(dk) + 64, v_stride = row_bytes(dv) + 32;   // other heads' rows between
    std::vector<char> k(n_kv * k_stride), v(n_kv * v_stride);
    auto fill = [&](char *row, int64_t d) {
        if (type == GGML_TYPE_F16) {
            for (int64_t i = 0; i < d; i++) ((uint16_t *)row)[i] = ggml_fp32_to_fp16(normal(g_rng));
            return;
        }
        std::uniform_int_distribution<int> q(-127, 127);
        for (int64_t b = 0; b < d / 32; b++) {
            block_q8_0 &blk = ((block_q8_0 *)row)[b];
            blk.d = random_half(0.02f);
            for (auto &x : blk.qs) x = (int8_t)q(g_rng);
        }
    };
    for (int64_t c = 0; c < n_kv; c++) fill(k.data() + c * k_stride, dk), fill(v.data() + c * v_stride, dv);
    std::vector<std::vector<float>> q(n_rows, std::vector<float>(dk));
    std::vector<std::vector<uint16_t>> mask(n_rows, std::vector<uint16_t>(n_kv));
    std::uniform_int_distribution<int> coin(0, 3);
    for (int r = 0; r < n_rows; r++) {
        for (auto &x : q[r]) x = 3.0f * normal(g_rng);
        for (int64_t c = 0; c < n_kv; c++)   // causal-like: row r sees up to n_kv - r, some cells hidden
            mask[r][c] = c >= n_kv - r || coin(g_rng) == 0 ? kMaskedBits : ggml_fp32_to_fp16(0.1f * normal(g_rng));
    }
    if (masked && n_rows > 1)   // a row that sees nothing: its output is 0
        for (auto &m : mask[n_rows - 1]) m = kMaskedBits;
    auto run = [&](AttendFn attend, std::vector<float> &out) {
        std::vector<float> acc(n_rows * dv);
        out.assign(n_rows * dv, NAN);
        AttentionTask t;
        t.dk = dk, t.dv = dv, t.n_kv = n_kv, t.n_rows = n_rows, t.scale = 1.0f / std::sqrt((float)dk);
        t.kv_type = type, t.k = k.data(), t.v = v.data(), t.k_stride = k_stride, t.v_stride = v_stride;
        t.acc = acc.data();
        for (int r = 0; r < n_rows; r++) {
            t.q[r] = q[r].data();
            t.mask[r] = masked ? mask[r].data() : nullptr;
            t.out[r] = out.data() + r * dv;
        }
        attend(t);
    };
    std::vector<float> want, got;
    run(kernels_for(Path::Scalar).attend, want);
    for (Path path : paths) {
        run(kernels_for(path).attend, got);
        char what[160];
        std::snprintf(what, sizeof what, "%s vs scalar: attention %s dk=%lld dv=%lld n_kv=%lld rows=%d mask=%d",
                      path_name(path), type == GGML_TYPE_F16 ? "f16" : "q8_0", (long long)dk, (long long)dv,
                      (long long)n_kv, n_rows, (int)masked);
        report(same_bytes(want, got), what);
    }
}

// The candidates' scan from every start, on logits with ties, NaNs and a rising floor.
void check_scan(int64_t n, const std::vector<Path> &paths) {
    std::normal_distribution<float> normal(0.0f, 4.0f);
    std::vector<float> x(n);
    for (auto &v : x) v = std::round(normal(g_rng) * 4.0f) / 4.0f;   // coarse values: ties
    for (int64_t i = 5; i < n; i += 37) x[i] = NAN;
    for (Path path : paths) {
        const AboveFn above = above_for(path);
        bool equal = true;
        for (float floor : {-100.0f, 0.0f, 6.0f, 11.0f, 1e9f})
            for (int64_t from = 0; from <= n; from++) equal = equal && above(x.data(), from, n, floor) == above_scalar(x.data(), from, n, floor);
        report(equal, std::string(path_name(path)) + " vs scalar: candidates scan n=" + std::to_string(n));
    }
}

}  // namespace
}  // namespace stackd

int main(int argc, char **argv) {
    using namespace stackd;
    const bool full = argc > 1 && std::strcmp(argv[1], "--full") == 0;
    g_corrupt = argc > 1 && std::strcmp(argv[1], "--self-test") == 0;
    const Path best = best_path();
    std::printf("cpu: best path %s\n", path_name(best));
    std::vector<Path> paths;
    for (int i = 1; i < kPathCount; i++)
        if (cpu_supports((Path)i)) paths.push_back((Path)i);
    std::string names;
    for (Path path : paths) names += std::string(" ") + path_name(path);
    std::printf("cpu: paths%s\n", names.empty() ? " none but scalar" : names.c_str());
    if (best == Path::Scalar)   // engine.kernels = auto registers nothing (server/engine/accel.py)
        std::printf("kernels: ggml's (no SIMD path of ours on this CPU)\n");
    else
        std::printf("kernels: ours, %s\n", path_name(best));

    // Rows: one group, and a partial last group; K: one block and several; tokens across every
    // tile size (4, 2, 1 after whole tiles of 4 and more).
    const std::vector<int64_t> rows = full ? std::vector<int64_t>{8, 43, 136} : std::vector<int64_t>{43};
    const std::vector<int64_t> tokens = full ? std::vector<int64_t>{1, 2, 3, 4, 5, 7, 8, 9, 16, 17}
                                             : std::vector<int64_t>{1, 3, 7};
    if (g_corrupt) {
        check_matmul(kFormats[1], 43, 160, 3, paths);
        std::printf("checks: %d, differing: %d (self-test)\n", g_checks, g_failures);
        return g_failures == 0 ? 0 : 1;
    }
    for (const Format &f : kFormats) {
        const std::vector<int64_t> ks = f.k_quant ? (full ? std::vector<int64_t>{256, 768, 1536} : std::vector<int64_t>{512})
                                                  : (full ? std::vector<int64_t>{32, 160, 1024} : std::vector<int64_t>{160});
        for (int64_t r : rows)
            for (int64_t k : ks)
                for (int64_t t : tokens) check_matmul(f, r, k, t, paths);
    }
    for (ggml_type type : {GGML_TYPE_F16, GGML_TYPE_Q8_0})
        for (int64_t d : full ? std::vector<int64_t>{64, 128, 256} : std::vector<int64_t>{64})
            for (int64_t n_kv : full ? std::vector<int64_t>{1, 15, 16, 37, 300} : std::vector<int64_t>{37})
                for (int n_rows : full ? std::vector<int>{1, 2, 3, 5, 16} : std::vector<int>{1, 3})
                    for (bool masked : {false, true}) check_attention(type, d, d, n_kv, n_rows, masked, paths);
    if (full) check_attention(GGML_TYPE_F16, 128, 64, 50, 4, true, paths);   // dk != dv
    check_scan(full ? 1000 : 200, paths);

    std::printf("checks: %d, differing: %d (paths checked against scalar:%s)\n", g_checks, g_failures,
                names.empty() ? " none" : names.c_str());
    return g_failures == 0 ? 0 : 1;
}
