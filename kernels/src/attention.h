// Decode attention: FLASH_ATTN_EXT on the steps ggml computes one query row at a time (every
// decode and verification step, kernels/README.md "Decode attention"), with f16 or q8_0 K and V
// (both of one type: the engine's KV cache, engine.kv_type).
//
// ggml's per-row path, for each query row and each cell: an f16 dot product, a scalar expf, and
// a multiply-add of the cell's V into an f16 accumulator (converted in and out at every cell).
// With grouped-query attention the heads that share a K/V head each read and convert every K
// and V row again. Ours takes the rows that share a K/V head together (one task), converts each
// K and V row once for all of them, computes sixteen cells' scores before one vector exp, and
// accumulates V in f32.
//
// The arithmetic, one query row q (its f32 values rounded to f16 first, as ggml rounds them for
// an f16 cache, so every product with an f16 K value is exact in f32), the cache's values as
// floats (f16 converted; q8_0 as int8 x the block's f16 scale, also exact), over the cells in
// blocks of kCellBlock = 16 from cell 0:
//   a cell is live if it is inside the view and its mask is not -inf
//   dot(c)   = sum16(a), a[l] = fma(k[c][16j+l], q[16j+l], a[l]) for j = 0, 1, ... (a[l] = 0 first)
//   s(c)     = dot(c) * scale + mask(c)                      (live cells; -inf otherwise)
//   a block with no live cell is skipped; otherwise, with m its largest s:
//   M'       = max(M, m);  ms = exp(M - M') (0 while M is -inf)
//   p(c)     = exp(s(c) - M') for live cells, 0 otherwise
//   S        = S * ms + sum16(p);  acc = acc * ms;  acc = fma(p(c), v[c], acc) for live c in order
//   M        = M'
// and the output is acc * (1 / S) (0 if S is 0). sum16 adds sixteen lanes as a tree:
// x[l] + x[l+8], then + the lane 4 on, + 2 on, + 1 on. exp is exp16 below, the same operations
// on every path. So each path computes the same bits; a row's result depends on its own cells
// only (not on the other rows of the task or the step, nor on the view's padding past its
// cells), which keeps decoding batch-invariant.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace stackd {

constexpr int kCellBlock = 16;
constexpr int kMaxTaskRows = 16;        // query rows in one task (a group's share)
constexpr int64_t kMaxHeadSize = 256;   // K and V head sizes we take (multiples of 16)

// exp(x) for x <= 0, the operations every path spells out (Cephes' expf polynomial):
//   below kExpFloor: 0 (the result would be subnormal; e^-86 of the running maximum adds nothing)
//   n = rint(x * log2 e);  r = fma(n, -ln2_hi, x);  r = fma(n, -ln2_lo, r)
//   p = kExpPoly[0];  p = fma(p, r, kExpPoly[i]) for i = 1..5;  y = fma(p, r * r, r) + 1
//   result = y * 2^n
// Within 2 ulp of exp over [-86, 0].
constexpr float kExpFloor = -86.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// One task: the query rows of one stream that share one K/V head.
struct AttentionTask {
    int64_t dk = 0, dv = 0;         // head sizes, multiples of 16, at most kMaxHeadSize
    int64_t n_kv = 0;               // cells in the view
    int n_rows = 0;                 // at most kMaxTaskRows
    float scale = 1.0f;
    const float *q[kMaxTaskRows];       // row r's dk values (the body rounds them to f16)
    const uint16_t *mask[kMaxTaskRows]; // row r's n_kv mask values (f16 bits), or null: no mask
    ggml_type kv_type = GGML_TYPE_F16;  // of K and V: F16 or Q8_0
    const char *k = nullptr;        // cell c's K row (dk values) at k + c * k_stride
    const char *v = nullptr;        // cell c's V row (dv values) at v + c * v_stride
    size_t k_stride = 0, v_stride = 0;
    float *out[kMaxTaskRows];       // row r's dv results
    float *acc = nullptr;           // scratch: n_rows x dv floats
};

using AttendFn = void (*)(const AttentionTask &task);

// Each path's body (attention_scalar.cpp; x86: attention_avx2.cpp, attention_avx512.cpp;
// aarch64: attention_neon.cpp, for both NEON paths).
void attend_scalar(const AttentionTask &task);
void attend_avx2(const AttentionTask &task);
void attend_avx512(const AttentionTask &task);
void attend_neon(const AttentionTask &task);

// The f16 bits of -inf: a mask value that hides a cell.
constexpr uint16_t kMaskedBits = 0xFC00;

// Whether we compute this FLASH_ATTN_EXT node: f32 queries, K and V both f16 or both q8_0, head
// sizes we take, no
// ALiBi, soft-capping or sinks, an f16 mask (or none), grouped heads that divide evenly.
bool can_attend(const ggml_tensor *node);

// Thread ith of nth's share of the node: tasks (stream, K/V head, rows) dealt round robin. The
// scale is the node's (op_params[0]), passed apart: while the node runs as a GGML_OP_CUSTOM of
// ours its op_params hold the custom op's.
void attention_share(ggml_tensor *node, float scale, AttendFn attend, int ith, int nth);

}  // namespace stackd
