#include "lockstep.h"

#include "ggml-backend.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <stdexcept>

namespace {

using namespace lockstep_wire;

// ---- the wire: little-endian fixed-width fields --------------------------------------------

void put_u16(std::string & out, uint16_t v) {
    const char b[2] = {(char) (v & 0xff), (char) (v >> 8)};
    out.append(b, 2);
}

void put_u32(std::string & out, uint32_t v) {
    const char b[4] = {(char) (v & 0xff), (char) ((v >> 8) & 0xff), (char) ((v >> 16) & 0xff), (char) (v >> 24)};
    out.append(b, 4);
}

void put_i32(std::string & out, int32_t v) { put_u32(out, (uint32_t) v); }

struct reader {
    const uint8_t * p;
    uint16_t u16() { const uint16_t v = (uint16_t) (p[0] | (p[1] << 8)); p += 2; return v; }
    uint32_t u32() {
        const uint32_t v = (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
        p += 4;
        return v;
    }
    int32_t i32() { return (int32_t) u32(); }
};

bool within(int32_t v, int32_t lo, int32_t hi) { return v >= lo && v <= hi; }

std::string check_op(const kv_op & op, const control_limits & l) {
    const bool seq_ok = within(op.seq, 0, l.n_seq_max - 1);
    const bool range_ok = within(op.p0, -1, l.n_ctx_seq) && within(op.p1, -1, l.n_ctx_seq);
    switch (op.op) {
        case KV_SEQ_RM:     // seq -1: every sequence
            return within(op.seq, -1, l.n_seq_max - 1) && range_ok ? "" : "a removal outside the cache";
        case KV_SEQ_CP:
            return seq_ok && within(op.seq_dst, 0, l.n_seq_max - 1) && range_ok ? "" : "a copy outside the cache";
        case KV_SEQ_KEEP:
            return seq_ok ? "" : "a keep outside the cache";
        case KV_SEQ_ADD:
            return seq_ok && range_ok && within(op.delta, -l.n_ctx_seq, l.n_ctx_seq) ? "" : "a shift outside the cache";
        case KV_CLEAR:
            return "";
        default:
            return "an unknown KV operation " + std::to_string(op.op);
    }
}

void apply_op(llama_context * ctx, const kv_op & op) {
    llama_memory_t mem = llama_get_memory(ctx);
    switch (op.op) {
        case KV_SEQ_RM:   llama_memory_seq_rm(mem, op.seq, op.p0, op.p1); break;
        case KV_SEQ_CP:   llama_memory_seq_cp(mem, op.seq, op.seq_dst, op.p0, op.p1); break;
        case KV_SEQ_KEEP: llama_memory_seq_keep(mem, op.seq); break;
        case KV_SEQ_ADD:  llama_memory_seq_add(mem, op.seq, op.p0, op.p1, op.delta); break;
        case KV_CLEAR:    llama_memory_clear(mem, true); break;
        default: break;
    }
}

uint64_t now_us() {
    return (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- the kernels' library --------------------------------------------------------------------

class stackd_transport : public tp_transport {
public:
    stackd_transport() {
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("STACKD");
        if (reg == nullptr) {
            throw std::runtime_error("tensor parallelism needs our kernels (engine.kernels: auto) registered");
        }
        send_ = (send_fn) ggml_backend_reg_get_proc_address(reg, "stackd_tp_send_control");
        recv_ = (recv_fn) ggml_backend_reg_get_proc_address(reg, "stackd_tp_recv_control");
        failed_ = (int_fn) ggml_backend_reg_get_proc_address(reg, "stackd_tp_failed");
        error_ = (error_fn) ggml_backend_reg_get_proc_address(reg, "stackd_tp_error");
        set_gather_ = (set_gather_fn) ggml_backend_reg_get_proc_address(reg, "stackd_tp_set_gather");
        if (!send_ || !recv_ || !failed_ || !error_ || !set_gather_) {
            throw std::runtime_error("the kernels' library has no tensor-parallel API (stackd_tp_*)");
        }
    }
    bool send(const std::string & payload) override { return send_(payload.data(), payload.size()) == 0; }
    int recv(std::string & payload, int timeout_ms) override {
        const void * data = nullptr;
        size_t size = 0;
        const int rc = recv_(&data, &size, timeout_ms);
        if (rc == 0) {
            payload.assign((const char *) data, data != nullptr ? size : 0);
        }
        return rc;
    }
    bool failed() const override { return failed_() != 0; }
    std::string error() const override {
        const char * why = error_();
        return why != nullptr && *why ? why : "the tensor-parallel link failed";
    }
    bool set_gather(uint32_t candidates) override {
        return candidates <= (uint32_t) INT32_MAX && set_gather_((int) candidates) == 0;
    }

private:
    using send_fn = int (*)(const void *, size_t);
    using set_gather_fn = int (*)(int);
    using recv_fn = int (*)(const void **, size_t *, int);
    using int_fn = int (*)(void);
    using error_fn = const char * (*)(void);
    send_fn send_ = nullptr;
    recv_fn recv_ = nullptr;
    int_fn failed_ = nullptr;
    error_fn error_ = nullptr;
    set_gather_fn set_gather_ = nullptr;
};

// ---- an in-process channel (tests): one leader, one follower ---------------------------------
// Memory ordering: a channel's queue and `closed` flag are touched only under its mutex (the
// condition variable waits with it held), so they are ordered on any CPU; the lockstep itself
// shares only `lost_` (seq_cst atomic: the watchdog's verdict, its reason under mu_reason_), the
// gather counters (relaxed: statistics) and g_leader_silence_ms (seq_cst, set by tests before a
// lockstep is made). Everything else a lockstep holds is its engine thread's alone; what
// crosses nodes crosses sockets (tp_link.cpp, whose Group says which orderings it relies on).

struct channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> queue;
    bool closed = false;
};

std::mutex g_channels_mu;
std::map<std::string, std::shared_ptr<channel>> g_channels;

std::shared_ptr<channel> channel_named(const std::string & name) {
    std::lock_guard<std::mutex> lock(g_channels_mu);
    auto & ch = g_channels[name];
    if (!ch) {
        ch = std::make_shared<channel>();
    }
    return ch;
}

class memory_transport : public tp_transport {
public:
    explicit memory_transport(const std::string & name) : ch_(channel_named(name)) {}
    bool send(const std::string & payload) override {
        std::lock_guard<std::mutex> lock(ch_->mu);
        if (ch_->closed) {
            return false;
        }
        ch_->queue.push_back(payload);
        ch_->cv.notify_all();
        return true;
    }
    int recv(std::string & payload, int timeout_ms) override {
        std::unique_lock<std::mutex> lock(ch_->mu);
        auto ready = [&] { return ch_->closed || !ch_->queue.empty(); };
        if (timeout_ms < 0) {
            ch_->cv.wait(lock, ready);
        } else if (!ch_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
            return 1;
        }
        if (!ch_->queue.empty()) {          // what was sent before a close still arrives
            payload = std::move(ch_->queue.front());
            ch_->queue.pop_front();
            return 0;
        }
        return -1;
    }
    bool failed() const override {
        std::lock_guard<std::mutex> lock(ch_->mu);
        return ch_->closed;
    }
    std::string error() const override { return "the in-process channel was closed"; }
    // both ends hold the whole model here: nothing is gathered, any mode the codec lets through goes
    bool set_gather(uint32_t candidates) override { return candidates <= kMaxGather; }

private:
    std::shared_ptr<channel> ch_;
};

}  // namespace

// ---- the message -----------------------------------------------------------------------------

std::string encode_control(const control_message & msg) {
    const size_t n = msg.tokens.size();
    std::string out;
    out.reserve(kHeaderBytes + msg.ops.size() * kOpBytes + n * kTokenBytes);
    put_u32(out, kMagic);
    put_u16(out, kVersion);
    put_u16(out, msg.kind);
    put_u32(out, msg.index);
    put_i32(out, msg.prev_rc);
    put_u32(out, (uint32_t) msg.ops.size());
    put_u32(out, (uint32_t) n);
    put_u32(out, 1);
    put_u32(out, msg.gather);
    for (const kv_op & op : msg.ops) {
        for (int32_t v : {op.op, op.seq, op.seq_dst, op.p0, op.p1, op.delta}) {
            put_i32(out, v);
        }
    }
    for (const std::vector<int32_t> * column : {&msg.tokens, &msg.pos, &msg.seq}) {
        for (size_t i = 0; i < n; ++i) {
            put_i32(out, i < column->size() ? (*column)[i] : 0);
        }
    }
    for (size_t i = 0; i < n; ++i) {
        out.push_back(i < msg.logits.size() && msg.logits[i] ? 1 : 0);
    }
    return out;
}

std::string decode_control(const void * data, size_t size, const control_limits & l, control_message & out) {
    if (data == nullptr || size < kHeaderBytes) {
        return "a control message of " + std::to_string(size) + " bytes is shorter than its header";
    }
    reader r{(const uint8_t *) data};
    if (r.u32() != kMagic) {
        return "not a lockstep message (magic)";
    }
    const uint16_t version = r.u16();
    if (version != kVersion) {
        return "lockstep version " + std::to_string(version) + ", this engine speaks " + std::to_string(kVersion);
    }
    out.kind = r.u16();
    out.index = r.u32();
    out.prev_rc = r.i32();
    const uint32_t n_ops = r.u32(), n_tokens = r.u32(), n_seq_per_token = r.u32();
    out.gather = r.u32();
    if (out.kind != kKindStep && out.kind != kKindStop) {
        return "an unknown message kind " + std::to_string(out.kind);
    }
    if (n_seq_per_token != 1) {
        return "a batch with other than one sequence per token";
    }
    if (out.gather > kMaxGather) {
        return "a logits gather of " + std::to_string(out.gather) + " candidates a row, over the " +
               std::to_string(kMaxGather) + " a message may ask";
    }
    if (out.gather != 0 && n_tokens == 0) {
        return "a logits gather without a batch";
    }
    if (n_ops > kMaxOps) {
        return std::to_string(n_ops) + " KV operations, over the " + std::to_string(kMaxOps) + " a message may carry";
    }
    if (n_tokens > (uint32_t) l.n_batch) {
        return "a batch of " + std::to_string(n_tokens) + " tokens, over this context's " + std::to_string(l.n_batch);
    }
    const size_t want = kHeaderBytes + (size_t) n_ops * kOpBytes + (size_t) n_tokens * kTokenBytes;
    if (size != want) {
        return "a message of " + std::to_string(size) + " bytes where its counts make " + std::to_string(want);
    }
    if (out.kind == kKindStop && (n_ops != 0 || n_tokens != 0)) {
        return "a stop that carries work";
    }
    out.ops.resize(n_ops);
    for (kv_op & op : out.ops) {
        op.op = r.i32(); op.seq = r.i32(); op.seq_dst = r.i32(); op.p0 = r.i32(); op.p1 = r.i32(); op.delta = r.i32();
        const std::string why = check_op(op, l);
        if (!why.empty()) {
            return why;
        }
    }
    out.tokens.resize(n_tokens);
    out.pos.resize(n_tokens);
    out.seq.resize(n_tokens);
    out.logits.resize(n_tokens);
    for (auto & v : out.tokens) {
        v = r.i32();
        if (!within(v, 0, l.n_vocab - 1)) {
            return "a token " + std::to_string(v) + " outside the vocabulary";
        }
    }
    for (auto & v : out.pos) {
        v = r.i32();
        if (!within(v, 0, l.n_ctx_seq - 1)) {
            return "a position " + std::to_string(v) + " outside the sequence's context";
        }
    }
    for (auto & v : out.seq) {
        v = r.i32();
        if (!within(v, 0, l.n_seq_max - 1)) {
            return "a sequence " + std::to_string(v) + " outside the slots";
        }
    }
    for (auto & v : out.logits) {
        v = *r.p++;
        if (v > 1) {
            return "an output flag other than 0 or 1";
        }
    }
    return "";
}

// ---- transports ------------------------------------------------------------------------------

std::unique_ptr<tp_transport> make_transport(const std::string & name) {
    if (name.empty() || name == "stackd") {
        return std::make_unique<stackd_transport>();
    }
    if (name.rfind("memory:", 0) == 0) {
        return std::make_unique<memory_transport>(name.substr(7));
    }
    throw std::invalid_argument("unknown tensor-parallel transport '" + name + "'");
}

void memory_channel_send(const std::string & name, const std::string & payload) {
    auto ch = channel_named(name);
    std::lock_guard<std::mutex> lock(ch->mu);
    ch->queue.push_back(payload);
    ch->cv.notify_all();
}

void memory_channel_close(const std::string & name) {
    auto ch = channel_named(name);
    std::lock_guard<std::mutex> lock(ch->mu);
    ch->closed = true;
    ch->cv.notify_all();
}

// ---- the lockstep ----------------------------------------------------------------------------

namespace {
std::atomic<int> g_leader_silence_ms{lockstep::kLeaderSilenceMs};
}  // namespace

int lockstep::set_leader_silence_for_tests(int ms) {
    if (ms < 0) {
        throw std::invalid_argument("a leader's silence bound of " + std::to_string(ms) +
                                    " ms: it is 1 ms or more (0: the default)");
    }
    return g_leader_silence_ms.exchange(ms == 0 ? kLeaderSilenceMs : ms);
}

lockstep::lockstep(int32_t rank, std::unique_ptr<tp_transport> transport)
    : rank_(rank), transport_(std::move(transport)), leader_silence_ms_(g_leader_silence_ms.load()) {
    if (rank_ >= 0 && !transport_) {
        throw std::invalid_argument("a tensor-parallel rank needs a transport");
    }
}

bool lockstep::seq_rm(llama_context * ctx, int32_t seq, int32_t p0, int32_t p1) {
    if (leader()) {
        pending_.push_back({KV_SEQ_RM, seq, 0, p0, p1, 0});
    }
    return llama_memory_seq_rm(llama_get_memory(ctx), seq, p0, p1);
}

void lockstep::clear(llama_context * ctx) {
    if (leader()) {
        pending_.clear();                 // what came before is cleared too
        pending_.push_back({KV_CLEAR, 0, 0, 0, 0, 0});
    }
    if (llama_memory_t mem = llama_get_memory(ctx)) {
        llama_memory_clear(mem, true);
    }
}

int32_t lockstep::decode(llama_context * ctx, const llama_batch & batch, uint32_t gather) {
    if (leader()) {
        if (lost()) {
            return kLost;
        }
        control_message msg;
        msg.index = index_++;
        msg.prev_rc = prev_rc_;
        msg.gather = batch.n_tokens > 0 && gather <= kMaxGather ? gather : 0;   // rows whole: always exact
        msg.ops.swap(pending_);
        const int32_t n = batch.n_tokens;
        msg.tokens.assign(batch.token, batch.token + n);
        msg.pos.assign(batch.pos, batch.pos + n);
        msg.seq.resize(n);
        msg.logits.resize(n);
        for (int32_t i = 0; i < n; ++i) {
            msg.seq[i] = batch.seq_id[i][0];     // the engine's batches: one sequence a token
            msg.logits[i] = batch.logits[i] ? 1 : 0;
        }
        if (!transport_->send(encode_control(msg))) {
            mark_lost(transport_->error());
            return kLost;
        }
        // the followers set the same mode from the message before their decode
        if (msg.gather != gather_set_) {
            if (!transport_->set_gather(msg.gather)) {
                mark_lost(transport_->error());
                return kLost;
            }
            gather_set_ = msg.gather;
        }
        bool outputs = false;
        for (int32_t i = 0; i < batch.n_tokens && !outputs; ++i) {
            outputs = batch.logits[i] != 0;
        }
        if (outputs) {
            (msg.gather > 0 ? n_gather_candidates_ : n_gather_full_).fetch_add(1, std::memory_order_relaxed);
        }
    }
    const int32_t rc = llama_decode(ctx, batch);
    if (leader()) {
        prev_rc_ = rc;
        if (rc != 0 && transport_->failed()) {
            mark_lost(transport_->error());
        }
    }
    return rc;
}

void lockstep::mark_lost(const std::string & why) {
    std::lock_guard<std::mutex> lock(mu_reason_);
    if (!lost_.load()) {
        lost_reason_ = why;
        lost_ = true;
    }
}

std::string lockstep::lost_reason() const {
    std::lock_guard<std::mutex> lock(mu_reason_);
    return lost_reason_;
}

void lockstep::stop() {
    if (!leader() || stopped_ || lost()) {
        return;
    }
    stopped_ = true;
    control_message msg;
    msg.kind = kKindStop;
    msg.index = index_++;
    msg.prev_rc = prev_rc_;
    transport_->send(encode_control(msg));
}

void lockstep::keepalive() {
    if (!leader() || stopped_ || lost()) {
        return;
    }
    control_message msg;
    msg.index = index_++;
    msg.prev_rc = prev_rc_;
    msg.ops.swap(pending_);
    if (!transport_->send(encode_control(msg))) {
        mark_lost(transport_->error());
    }
}

std::string lockstep::follow(llama_context * ctx, llama_batch & batch, const control_limits & limits,
                             const std::atomic<bool> & stopping,
                             const std::function<void(int32_t, uint64_t)> & on_decode) {
    if (rank_ <= 0) {
        return "error: only a follower (tensor-parallel rank > 0) follows";
    }
    using clock = std::chrono::steady_clock;
    const auto silence_bound = std::chrono::milliseconds(leader_silence_ms_);
    std::string payload;
    control_message msg;
    uint32_t expected = 0;
    int32_t last_rc = 0;
    bool heard = false;                   // the watchdog runs from the leader's first message
    clock::time_point waiting_since = clock::now();
    while (!stopping.load()) {
        int wait_ms = 200;                // short: a close() waits at most this
        if (heard) {
            const auto left = silence_bound - (clock::now() - waiting_since);
            wait_ms = (int) std::clamp<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1, wait_ms);
        }
        const int got = transport_->recv(payload, wait_ms);
        if (got == 1) {
            if (heard && clock::now() - waiting_since >= silence_bound) {
                const std::string why = "the leader sent nothing for " + std::to_string(leader_silence_ms_) +
                                        " ms (its keepalive is every " + std::to_string(kKeepaliveMs) + " ms)";
                mark_lost(why);
                return "lost: " + why;
            }
            continue;
        }
        if (got != 0) {
            mark_lost(transport_->error());
            return "lost: " + transport_->error();
        }
        heard = true;
        waiting_since = clock::now();
        const std::string why = decode_control(payload.data(), payload.size(), limits, msg);
        if (!why.empty()) {
            return "error: bad control message " + std::to_string(expected) + ": " + why;
        }
        if (msg.index != expected) {
            return "error: control message " + std::to_string(msg.index) + " where " + std::to_string(expected) +
                   " was due";
        }
        expected += 1;
        if (msg.prev_rc != last_rc) {
            return "error: out of step: the leader's last decode returned " + std::to_string(msg.prev_rc) +
                   ", this node's " + std::to_string(last_rc);
        }
        if (msg.kind == lockstep_wire::kKindStop) {
            return "stop";
        }
        for (const kv_op & op : msg.ops) {
            apply_op(ctx, op);
        }
        const int32_t n = (int32_t) msg.tokens.size();
        if (n == 0) {
            continue;
        }
        if (msg.gather != gather_set_) {      // the leader's mode for this batch, before it runs
            if (!transport_->set_gather(msg.gather)) {
                return "error: control message " + std::to_string(msg.index) + ": " + transport_->error();
            }
            gather_set_ = msg.gather;
        }
        batch.n_tokens = n;
        for (int32_t i = 0; i < n; ++i) {
            batch.token[i] = msg.tokens[i];
            batch.pos[i] = msg.pos[i];
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = msg.seq[i];
            batch.logits[i] = (int8_t) msg.logits[i];
        }
        const uint64_t t0 = now_us();
        last_rc = llama_decode(ctx, batch);
        llama_synchronize(ctx);
        waiting_since = clock::now();     // this node's decode is not the leader's silence
        if (last_rc != 0 && transport_->failed()) {
            mark_lost(transport_->error());
            return "lost: " + transport_->error();
        }
        if (on_decode) {
            on_decode(n, now_us() - t0);
        }
    }
    return "closed";
}
