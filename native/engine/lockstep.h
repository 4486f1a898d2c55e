// Tensor parallelism's lockstep (issue 36; docs/cluster.md, "Tensor parallelism"): the one place
// through which the engine does every llama_decode and every KV-memory operation.
//
// Every node of a tensor-parallel group runs an engine on its shard of the model. Rank 0 (the
// leader) schedules and samples; ranks > 0 (followers) only mirror what changes its state, so
// every node's KV cache holds the same cells and every node runs the same graphs, whose
// exchanges (kernels/src/tp.h) then pair up. On the leader this class applies each KV operation
// at once and records it; before each llama_decode it sends the followers one control message:
// the operations since the last message and the batch. A follower (follow()) applies the
// operations and decodes the batch, message after message, and never samples. An idle leader
// sends a message without a batch every second (keepalive), so a follower lost between requests
// is found then, and a follower finds a leader silent for ten of them lost (kLeaderSilenceMs).
// Nothing in the engine decodes outside a plan's step (no warm-up): every decode and every KV
// operation is the scheduler's, and all of them go through here.
//
// The control message (little-endian; a payload of the kernels' KIND_CONTROL frame, which
// carries its length, step and tag):
//     u32 magic "STLK"  u16 version (2)  u16 kind (1 step, 2 stop)  u32 index (0, 1, ... since
//     the group formed)  i32 prev_rc (the leader's last llama_decode result)  u32 n_ops
//     u32 n_tokens  u32 n_seq_per_token (1)  u32 gather (0 .. kMaxGather)            32 bytes
//     n_ops x {i32 op, seq, seq_dst, p0, p1, delta}                                    24 bytes each
//     n_tokens x i32 token, then n_tokens x i32 pos, n_tokens x i32 seq, n_tokens x u8 logits
// The engine puts each token in exactly one sequence (its slot), so a token has one sequence id.
// `gather` is how the batch's logits rows reach the leader (kernels/src/tp.h, stackd_tp_set_gather):
// 0 every follower's rows whole, K > 0 each follower's top K candidates a row; the leader chose it
// for the step (the engine: what its rows' requests need), and every node sets it before the
// decode. A message without a batch (a keepalive, a stop) carries 0. (Version 1's field was 0.)
// A follower checks every field against its own context before touching llama.cpp (limits): a
// message that does not fit ends follow() with an error, never a crash. The index catches a
// lost or repeated message; prev_rc catches two nodes whose decodes diverged (a follower whose
// KV cells differ from the leader's fails the next batch's position checks, where the leader's
// did not).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "llama.h"

namespace lockstep_wire {
constexpr uint32_t kMagic = 0x4b4c5453;         // "STLK"
constexpr uint16_t kVersion = 2;
constexpr uint16_t kKindStep = 1, kKindStop = 2;
constexpr size_t kHeaderBytes = 32, kOpBytes = 24, kTokenBytes = 13;
constexpr uint32_t kMaxOps = 1 << 16;           // KV operations one message may carry
constexpr uint32_t kMaxGather = 64;             // candidates a row at most (the kernels' kMaxCandidates)
}  // namespace lockstep_wire

enum kv_op_kind : int32_t {
    KV_SEQ_RM = 1,      // llama_memory_seq_rm(seq, p0, p1)
    KV_SEQ_CP = 2,      // llama_memory_seq_cp(seq, seq_dst, p0, p1)
    KV_SEQ_KEEP = 3,    // llama_memory_seq_keep(seq)
    KV_SEQ_ADD = 4,     // llama_memory_seq_add(seq, p0, p1, delta)
    KV_CLEAR = 5,       // llama_memory_clear(data = true)
};

struct kv_op {
    int32_t op = 0, seq = 0, seq_dst = 0, p0 = 0, p1 = 0, delta = 0;
};

struct control_message {
    uint16_t kind = lockstep_wire::kKindStep;
    uint32_t index = 0;
    int32_t prev_rc = 0;
    uint32_t gather = 0;                // 0: logits rows whole; K: K candidates a row (and follower)
    std::vector<kv_op> ops;
    std::vector<int32_t> tokens, pos, seq;
    std::vector<uint8_t> logits;
};

// What a follower's context takes: a message is checked against these before anything is applied.
struct control_limits {
    int32_t n_batch = 0;      // tokens per decode (llama_n_batch)
    int32_t n_seq_max = 0;    // sequences (slots)
    int32_t n_vocab = 0;
    int32_t n_ctx_seq = 0;    // positions per sequence
};

std::string encode_control(const control_message & msg);
// "" when `data` is a well-formed message within `limits` (then in `out`), else what is wrong.
std::string decode_control(const void * data, size_t size, const control_limits & limits, control_message & out);

// How control messages travel: the kernels' library (stackd_tp_send_control / recv_control,
// looked up on the STACKD backend registry), or a channel in this process for tests.
class tp_transport {
public:
    virtual ~tp_transport() = default;
    virtual bool send(const std::string & payload) = 0;                 // leader
    virtual int recv(std::string & payload, int timeout_ms) = 0;        // 0, 1 timeout, -1 failed
    virtual bool failed() const = 0;                                    // the group failed
    virtual std::string error() const = 0;
    // The next decodes' logits gather (stackd_tp_set_gather); false (error() says why) when refused.
    virtual bool set_gather(uint32_t candidates) = 0;
};

// "" or "stackd": the kernels' library (throws std::runtime_error when it is not registered or
// lacks the tensor-parallel API); "memory:<name>": the named in-process channel (tests).
std::unique_ptr<tp_transport> make_transport(const std::string & name);
// Tests: a raw payload into an in-process channel (a hostile leader), or the channel closed
// (a lost link).
void memory_channel_send(const std::string & name, const std::string & payload);
void memory_channel_close(const std::string & name);

class lockstep {
public:
    // rank -1: no tensor parallelism (every call goes straight to llama.cpp).
    lockstep(int32_t rank, std::unique_ptr<tp_transport> transport);

    bool active() const { return rank_ >= 0; }
    bool leader() const { return rank_ == 0; }

    // The KV operations the engine does (each applied here at once, and recorded on a leader).
    bool seq_rm(llama_context * ctx, int32_t seq, int32_t p0, int32_t p1);
    void clear(llama_context * ctx);
    // llama_decode (the leader sends its message first). kLost: the group was lost before the
    // batch could go (nothing decoded). `gather` (leader): how this batch's logits rows come to
    // the leader, 0 whole or K <= kMaxGather candidates a row (what the rows' requests allow).
    static constexpr int32_t kLost = -100;
    int32_t decode(llama_context * ctx, const llama_batch & batch, uint32_t gather = 0);
    // Leader: its decodes with output rows, by how their rows were gathered.
    uint64_t n_gather_full() const { return n_gather_full_.load(); }
    uint64_t n_gather_candidates() const { return n_gather_candidates_.load(); }
    // Once the group failed (a send refused, or a decode failed with the transport failed): why.
    bool lost() const { return lost_.load(); }
    std::string lost_reason() const;
    // Leader: the followers' last message (their follow() returns "stop"). Once.
    void stop();
    // Leader, idle: a message without a batch (the KV operations since the last), every
    // kKeepaliveMs, so that a follower gone between requests fails a send (lost()) then.
    static constexpr int kKeepaliveMs = 1000;
    void keepalive();

    // Follower: the frozen-leader watchdog. Once the leader's first message has come, a follower
    // that then hears nothing for this long ends follow() with "lost: the leader sent nothing for
    // N ms (its keepalive is every 1000 ms)", and lost()/lost_reason() say it: a leader alive but
    // silent (SIGSTOP, a hung process, a link that drops packets without closing) must not hold
    // its followers in follow() for ever. Ten keepalives: what runs on the leader between two
    // messages (sampling a step's rows, its scheduling, a busy host's jitter; its decodes run with
    // the followers', whose clock starts again after each) must never come near it. The daemon's
    // own heartbeat fencing (3 s) and the exchange's deadline (2 s) are the faster paths; this is
    // the in-process backstop. Before the first message nothing is bounded here: a leader that
    // loads its shard slower than this follower is not silent (one whose worker dies closes its
    // links, which ends follow() at once).
    static constexpr int kLeaderSilenceMs = 10 * kKeepaliveMs;
    // Tests: the bound the lockstep objects constructed from now on take, in ms (0: kLeaderSilenceMs
    // again); returns the previous one. Throws std::invalid_argument when ms < 0.
    static int set_leader_silence_for_tests(int ms);
    int leader_silence_ms() const { return leader_silence_ms_; }

    // Follower: message after message until a stop, a failure or `stopping`. Returns "stop", or
    // "closed" (stopping), or "lost: ..." (the link, or the leader silent past the watchdog's
    // bound: then lost() too), or "error: ..." (a message that does not fit, a decode that
    // diverged). `on_decode(n_tokens, us)` after each batch.
    std::string follow(llama_context * ctx, llama_batch & batch, const control_limits & limits,
                       const std::atomic<bool> & stopping,
                       const std::function<void(int32_t, uint64_t)> & on_decode);

private:
    void mark_lost(const std::string & why);

    int32_t rank_;
    std::unique_ptr<tp_transport> transport_;
    int leader_silence_ms_;             // follower: the watchdog's bound (kLeaderSilenceMs)
    std::vector<kv_op> pending_;        // leader: the operations since the last message
    uint32_t index_ = 0;
    int32_t prev_rc_ = 0;
    bool stopped_ = false;
    uint32_t gather_set_ = UINT32_MAX;  // the mode the transport holds (set again only on a change)
    std::atomic<uint64_t> n_gather_full_{0}, n_gather_candidates_{0};
    std::atomic<bool> lost_{false};
    mutable std::mutex mu_reason_;
    std::string lost_reason_;
};
