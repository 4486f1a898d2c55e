// Tensor parallelism inside our backend (issue 36; kernels/README.md, "Tensor parallelism").
//
// A process joins a tensor-parallel group with stackd_tp_attach: rank r of n, one connected and
// already authenticated TCP socket per peer (server/engine/exchange/mesh.py made them) and the
// link's session key. While attached, our backend's graphs exchange over those links:
//   - every ADD named `ffn_inp-<il>` / `l_out-<il>` becomes "all-reduce src[0] with every peer,
//     summed in node order 0, 1, ... in double, rounded, then + src[1]" (every node holds the
//     same bits, and one node's bits: src[0] is a product in the chunked form, kernels.h);
//   - the MUL_MAT named `result_output` computes rows [vocab_cut[r], vocab_cut[r+1]) only, and
//     followers send rank 0 what sampling needs of their rows (stackd_tp_set_gather: the rows
//     whole, or each row's top K candidates), which rank 0 writes into its full logits.
// The wire is server/engine/exchange/frames.py's frame, byte for byte:
//     u32 magic  u16 kind  u16 sender  u64 step  u32 length | payload | 16-byte tag
//     tag = ChaCha20-Poly1305(session key, nonce = header[4:16], associated data = header + payload)
// One step counter for every exchange (partial sums, logits, control messages), the same on
// every node. A frame with a wrong magic, kind, sender, step, length or tag, a peer that closes,
// or an exchange past its deadline fails the group: every link is shut, graph_compute returns
// GGML_STATUS_FAILED from then on (llama_decode fails), nothing waits forever, nothing crashes.
#pragma once

#include <cstddef>
#include <cstdint>

#ifndef STACKD_API
#define STACKD_API extern "C" __attribute__((visibility("default")))
#endif

// ---- the C API: exported by libstackd_kernels.so and returned by the STACKD registry's
// ggml_backend_reg_get_proc_address under the same names ----

// Join a tensor-parallel group. rank of n; fds[i]: a connected, already authenticated TCP
// socket to peer i (fds[rank] = -1); keys: n x 32 bytes, keys[i] the session key of the link to
// i (frames.session_key); the library owns the fds from then on (closed at detach, or by this
// call when it fails). vocab_cut: n + 1 row boundaries (0 ... n_vocab), multiples of 64 but the
// last. deadline_ms: one exchange at most. spin_us: poll the sockets this long before sleeping.
// Needs the kernels registered (stackd_kernels_register): with them off no graph is ours.
// Returns 0, or -1 (stackd_tp_error says why).
STACKD_API int stackd_tp_attach(int rank, int n, const int *fds, const uint8_t *keys, const int64_t *vocab_cut,
                                int deadline_ms, int spin_us);
STACKD_API void stackd_tp_detach(void);   // close links; graphs run single-node again
STACKD_API int stackd_tp_active(void);    // 1 while attached and healthy
STACKD_API int stackd_tp_failed(void);    // 1 once any exchange failed (links shut); decodes then fail
STACKD_API const char *stackd_tp_error(void);
// Leader (rank 0) -> every follower, an opaque payload (KIND_CONTROL, at most kMaxControl bytes).
STACKD_API int stackd_tp_send_control(const void *data, size_t size);
// Follower: waits up to timeout_ms (-1 forever; wakes on link loss and on detach) for the
// leader's next control payload; *data stays valid until the next call. 0, 1 timeout, -1 failed.
STACKD_API int stackd_tp_recv_control(const void **data, size_t *size, int timeout_ms);
// bytes_sent: what this node sent, and on rank 0 also the logits frames its followers sent it
// (rank 0's counters are the ones a daemon's /metrics shows; the gather goes one way only).
STACKD_API void stackd_tp_counters(uint64_t *exchanges, uint64_t *bytes_sent, uint64_t *control_frames);
// How the next graphs' logits are gathered to rank 0 (set by every node before each decode, the
// same value on every node: the lockstep's control message carries it). 0: every follower sends
// its rows whole (any request). 1..kMaxCandidates: each follower sends, per output row, its K
// highest (token, logit) by descending logit, equal logits by lower token (min(K, its rows)),
// and rank 0 writes them into its row with the rest of that follower's range at -inf; exact for
// what depends only on a row's top K (greedy, top-k <= K: docs/cluster.md says which requests).
// 0, or -1 when K is out of range (the mode is unchanged). Reset to 0 at attach.
STACKD_API int stackd_tp_set_gather(int candidates);
// Tests and benches only (bench/cluster.py --link-delay-us, --free-links), set before attach
// and kept across attaches: each exchange's frames held delay_us (clamped to 0..1,000,000)
// before they go; free_links != 0: no partial sum and no logits sent (wrong answers: the
// speed of a link that costs nothing). 0, 0: a real link.
STACKD_API void stackd_tp_set_test_link(int delay_us, int free_links);
// Logits gathers by path since the process started (this node's graphs): rows whole, candidates.
STACKD_API void stackd_tp_gather_counters(uint64_t *full, uint64_t *candidates);
// Nanoseconds inside the partial-sum and logits exchanges since attach (added after the contract).
STACKD_API uint64_t stackd_tp_exchange_ns(void);
// bench/tp_exchange.py --native: `count` all-reduces of `floats` values (doubles on the wire,
// as a partial sum is), each one's microseconds in us[i].
STACKD_API int stackd_tp_time_allreduce(int floats, int count, double *us);

namespace stackd::tp {

constexpr uint32_t kMagic = 0x31585453;     // "STX1"
constexpr uint16_t kKindPartial = 1, kKindControl = 2, kKindLogits = 3;
constexpr size_t kHeaderBytes = 20, kTagBytes = 16, kKeyBytes = 32;
constexpr size_t kMaxPayload = size_t(64) << 20;   // frames.MAX_PAYLOAD
constexpr size_t kMaxControl = size_t(4) << 20;    // frames.MAX_CONTROL
constexpr int64_t kVocabBlock = 64;
// Candidates per follower and row at most (stackd_tp_set_gather): top_k up to 64 (llama.cpp's
// default 40, Hugging Face's 50) with room for a few banned tokens; 8 bytes each, 512 bytes a
// row against 98 KiB for half of SmolLM2's vocabulary.
constexpr int kMaxCandidates = 64;

struct Candidate {   // on the wire: i32 token, f32 logit (little-endian, as every frame)
    int32_t token;
    float logit;
};
static_assert(sizeof(Candidate) == 8);

// What the backend asks and calls (backend.cpp, tp_backend.cpp; all on the thread computing the graph).
bool attached();           // attached, failed or not
bool failed();
// Changes at every attach and detach: a graph begun under one group that ends under another
// (detached meanwhile) has lost exchanges and fails.
uint64_t generation();
int rank();
int size();
// Rows [begin, end) of the vocabulary projection this rank computes; false if n_vocab is not the cut's end.
bool vocab_rows(int64_t n_vocab, int64_t *begin, int64_t *end);
// dst = (float)(node 0's partial + node 1's + ..., in double) + src1: this node's partial is
// `mine`, n doubles (the chunked form's sums before rounding, kernels.h's GemmOut), on the
// wire as doubles; src1 and dst n floats. dst may alias src1. False (the group failed; dst
// unwritten) on any failure.
bool allreduce_add(const double *mine, const float *src1, float *dst, size_t n);
// The gather's mode for the graph being computed (stackd_tp_set_gather): 0 rows whole, else K.
int gather_candidates();
// The logits rows [cut[r], cut[r+1]) of `tokens` rows of `stride` floats: a follower sends its
// block to rank 0, or with K candidates (K = gather_candidates() > 0) `candidates`, tokens x
// min(K, its rows) of them row after row (tp_backend.cpp's order: by descending logit, equal
// logits by lower token, NaN as -inf); rank 0 receives every
// follower's into logits, checking each candidate (in the sender's rows, in order, not NaN).
// False when the group failed (then with the reason).
bool gather_logits(float *logits, int64_t tokens, size_t stride, const Candidate *candidates);
// Marks the group failed with this reason (a graph we cannot rewrite); shuts every link.
void fail(const char *why);

}  // namespace stackd::tp
