// The tensor-parallel group of this process: its links, the frames on them, and the three
// exchanges (tp.h): the all-reduce of a partial sum, the gather of the logits, the leader's
// control messages. The I/O loop is mesh.py's _run in C++: every frame to send goes out first,
// then every socket is tried without blocking, for spin_us before sleeping in poll(), until the
// exchange's deadline. Frames are read exactly (never past the awaited one), so a link's next
// frame stays in its socket.
#include "tp.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "tp_tag.h"

namespace stackd::tp {

namespace {

using Clock = std::chrono::steady_clock;

struct Link {
    int fd = -1;
    FrameTag mac;               // the link's session key
    std::vector<uint8_t> out;   // the frame being sent
    size_t sent = 0;
    std::vector<uint8_t> in;    // the frame being received
    size_t filled = 0, want = 0;
    bool sending = false, receiving = false, header_checked = false;
    uint16_t kind = 0;
    size_t length = 0;          // the payload awaited; SIZE_MAX: any, up to kMaxControl
};

constexpr size_t kAnyLength = SIZE_MAX;

// How long a follower polls for its leader's next control message before it sleeps in poll().
// Between two steps of a stream the leader samples and plans (tens to a few hundred us); a wake
// from poll() costs a virtual machine's vCPU tens of us (bench/tp_exchange.py's ping-pong),
// paid every step on the critical path. An idle follower spins this long once a message.
constexpr int kControlSpinUs = 1000;

// Memory ordering (what holds on a weakly ordered CPU, aarch64, as on x86's TSO):
// - Every field below that an exchange reads or writes (links and their buffers, rank, n, cut,
//   step, sum, rows, control, deadline_ms, spin_us, free_links, link_delay_us) is touched only
//   under `io`: attach, detach, each exchange and each control message take it, so the mutex's
//   acquire and release order them. No field is shared lock-free but the atomics.
// - `attached` is stored with release last in attach (after every field above) and first
//   in detach; readers without the lock (attached(), rank() and size() after it, backend.cpp
//   deciding to swap nodes in) load it with acquire, so a reader that sees true sees the
//   fields attach set. `generation` (acquire loads, seq_cst bumps under `io`) and `failed`
//   (seq_cst exchange, acquire loads) are single words whose value is the whole message: a
//   graph that began under one generation fails if it changed (backend.cpp, tp_backend.cpp).
// - The partial sums an exchange sends are written by ggml's threads and read by thread 0
//   after an OpenMP barrier (tp_backend.cpp), and what thread 0 writes back is read by the others
//   after ggml's next barrier between nodes: both barriers are full fences (OpenMP's implies a
//   flush; ggml's is seq_cst atomics), so no extra fence is needed around the buffers.
// - `gather` is a mode word set between steps (stackd_tp_set_gather) and read by the next
//   step's logits node: relaxed suffices (a lone int, never torn; the control message that
//   starts the step crosses a socket and the graph's barriers after the store). The counters
//   (exchanges, bytes_sent, control_frames, exchange_ns, gathers_*) are statistics: relaxed
//   adds and loads, read for metrics, ordering nothing.
struct Group {
    std::mutex io;               // one exchange at a time; attach and detach wait for it
    int rank = 0, n = 0;
    std::vector<Link> links;     // by peer; links[rank] unused
    std::vector<int64_t> cut;
    int deadline_ms = 2000, spin_us = 0;
    uint64_t step = 0;
    std::vector<uint8_t> control;  // the last control payload a follower received
    std::vector<double> sum;     // an all-reduce's sums
    std::vector<float> rows;     // a follower's logits rows, packed to send
    std::atomic<bool> attached{false}, failed{false};
    std::atomic<uint64_t> generation{1};   // bumped by every attach and detach
    std::mutex error_mutex;
    std::string error;
    std::atomic<uint64_t> exchanges{0}, bytes_sent{0}, control_frames{0};
    std::atomic<uint64_t> exchange_ns{0};   // time inside the partial-sum and logits exchanges
    // stackd_tp_set_test_link (tests and benches only; set before attach, kept across attaches):
    int link_delay_us = 0;       // a slower link: each exchange's frames held this long, 0: none
    bool free_links = false;     // the ceiling: exchange nothing
    std::atomic<int> gather{0};  // stackd_tp_set_gather: 0 logits rows whole, else K candidates a row
    std::atomic<uint64_t> gathers_full{0}, gathers_candidates{0};
};

Group &group() {
    static Group g;
    return g;
}

void set_error(Group &g, const std::string &why) {
    std::lock_guard<std::mutex> lock(g.error_mutex);
    g.error = why;
}

// Shuts every link (peers see the close at once); the fds stay ours until detach closes them,
// so a concurrent detach never touches a number the process reused.
void fail_locked(Group &g, const std::string &why) {
    if (!g.failed.exchange(true)) set_error(g, why);
    for (Link &l : g.links) {
        if (l.fd >= 0) shutdown(l.fd, SHUT_RDWR);
    }
}

void put_header(uint8_t *h, uint16_t kind, uint16_t sender, uint64_t step, uint32_t length) {
    // little endian on the wire, as frames.HEADER ("<IHHQI"); x86 and aarch64 Linux are too
    std::memcpy(h, &kMagic, 4);
    std::memcpy(h + 4, &kind, 2);
    std::memcpy(h + 6, &sender, 2);
    std::memcpy(h + 8, &step, 8);
    std::memcpy(h + 16, &length, 4);
}

// The frame of `payload` for link l (header, payload, tag) in l.out, to send.
void stage_send(Group &g, Link &l, uint16_t kind, const void *payload, size_t length) {
    l.out.resize(kHeaderBytes + length + kTagBytes);
    put_header(l.out.data(), kind, (uint16_t)g.rank, g.step, (uint32_t)length);
    if (length) std::memcpy(l.out.data() + kHeaderBytes, payload, length);
    if (!l.mac.tag(l.out.data(), kHeaderBytes, l.out.data() + kHeaderBytes, length, l.out.data() + kHeaderBytes + length)) {
        std::memset(l.out.data() + kHeaderBytes + length, 0, kTagBytes);   // libcrypto failed: the peer refuses it
    }
    l.sent = 0;
    l.sending = true;
}

void stage_receive(Link &l, uint16_t kind, size_t length) {
    l.kind = kind;
    l.length = length;
    l.want = length == kAnyLength ? kHeaderBytes : kHeaderBytes + length + kTagBytes;
    if (l.in.size() < l.want) l.in.resize(l.want);
    l.filled = 0;
    l.header_checked = false;
    l.receiving = true;
}

// "" when the header is what link `peer` awaits, else why not (frames.check_header's reasons).
std::string check_header(const Group &g, const Link &l, int peer) {
    uint32_t magic, length;
    uint16_t kind, sender;
    uint64_t step;
    const uint8_t *h = l.in.data();
    std::memcpy(&magic, h, 4);
    std::memcpy(&kind, h + 4, 2);
    std::memcpy(&sender, h + 6, 2);
    std::memcpy(&step, h + 8, 8);
    std::memcpy(&length, h + 16, 4);
    char why[160];
    if (magic != kMagic) return "not an exchange frame (bad magic)";
    if (kind != l.kind) {
        std::snprintf(why, sizeof why, "a frame of kind %u where kind %u was awaited", kind, l.kind);
        return why;
    }
    if (sender != peer) {
        std::snprintf(why, sizeof why, "a frame from node %u on node %d's link", sender, peer);
        return why;
    }
    if (l.length == kAnyLength ? length > kMaxControl : length != l.length) {
        std::snprintf(why, sizeof why, "a frame of %u bytes where %zu were awaited", length,
                      l.length == kAnyLength ? kMaxControl : l.length);
        return why;
    }
    if (step != g.step) {
        std::snprintf(why, sizeof why, "a frame of step %llu where step %llu was awaited", (unsigned long long)step,
                      (unsigned long long)g.step);
        return why;
    }
    return "";
}

bool tag_matches(const Link &l) {
    const size_t length = l.want - kHeaderBytes - kTagBytes;
    uint8_t tag[kTagBytes];
    if (!l.mac.tag(l.in.data(), kHeaderBytes, l.in.data() + kHeaderBytes, length, tag)) return false;
    uint8_t diff = 0;   // constant time, as hmac.compare_digest
    for (size_t i = 0; i < kTagBytes; i++) diff |= tag[i] ^ l.in[kHeaderBytes + length + i];
    return diff == 0;
}

const char *kind_name(uint16_t kind) {
    return kind == kKindPartial ? "partial sum" : kind == kKindLogits ? "logits" : "control";
}

// Sends and receives every staged frame, until all are done or one fails or `until` passes.
// On failure the group is failed (every link shut) and false returned.
bool run_io(Group &g, Clock::time_point until, uint16_t kind);

// run_io, its time counted for the exchanges a graph waits on (not a follower's idle wait).
bool run(Group &g, Clock::time_point until, uint16_t kind) {
    const auto t0 = Clock::now();
    if (g.link_delay_us > 0 && kind != kKindControl) {
        // A link this much slower one way (what `tc netem delay` would add, where the kernel
        // has it): the frames are held before they go, the node waiting as it would for them.
        const auto release = t0 + std::chrono::microseconds(g.link_delay_us);
        while (Clock::now() < release) {
        }
    }
    const bool ok = run_io(g, until, kind);
    if (kind != kKindControl) {
        g.exchange_ns.fetch_add((uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
                                std::memory_order_relaxed);
    }
    return ok;
}

// Between two tries of a spin: whatever else wants this core runs first (the peer's node on a
// shared core, this node's daemon writing a token): a spin that kept them off the core would
// hold up the very frame it waits for.
inline void spin_pause() { sched_yield(); }

bool run_io(Group &g, Clock::time_point until, uint16_t kind) {
    const auto spin_until = Clock::now() + std::chrono::microseconds(g.spin_us);
    std::vector<pollfd> fds;
    fds.reserve(g.links.size());
    auto failure = [&](int peer, const std::string &why) {
        char head[96];
        std::snprintf(head, sizeof head, "exchange %llu (%s) failed: node %d: ", (unsigned long long)g.step,
                      kind_name(kind), peer);
        fail_locked(g, head + why);
        return false;
    };
    for (;;) {
        bool busy = false, progressed = false;
        for (int p = 0; p < g.n; p++) {
            Link &l = g.links[p];
            if (!l.sending) continue;
            const ssize_t n = send(l.fd, l.out.data() + l.sent, l.out.size() - l.sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                    busy = true;
                    continue;
                }
                return failure(p, std::string("send: ") + std::strerror(errno));
            }
            progressed = true;
            l.sent += (size_t)n;
            if (l.sent == l.out.size()) l.sending = false;
            else busy = true;
        }
        for (int p = 0; p < g.n; p++) {
            Link &l = g.links[p];
            if (!l.receiving) continue;
            const ssize_t n = recv(l.fd, l.in.data() + l.filled, l.want - l.filled, MSG_DONTWAIT);
            if (n == 0) return failure(p, "the link closed");
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                    busy = true;
                    continue;
                }
                return failure(p, std::string("receive: ") + std::strerror(errno));
            }
            progressed = true;
            l.filled += (size_t)n;
            if (!l.header_checked && l.filled >= kHeaderBytes) {
                const std::string why = check_header(g, l, p);
                if (!why.empty()) return failure(p, why);
                l.header_checked = true;
                if (l.length == kAnyLength) {   // a control frame: its length is now known (and bounded)
                    uint32_t length;
                    std::memcpy(&length, l.in.data() + 16, 4);
                    l.want = kHeaderBytes + length + kTagBytes;
                    if (l.in.size() < l.want) l.in.resize(l.want);
                }
            }
            if (l.filled == l.want && l.header_checked) {
                if (!tag_matches(l)) return failure(p, "a frame's signature does not match the link's key");
                l.receiving = false;
            } else {
                busy = true;
            }
        }
        if (!busy) return true;
        if (progressed) continue;
        const auto now = Clock::now();
        if (now < spin_until) {   // spinning: try the sockets again
            spin_pause();
            continue;
        }
        if (now >= until) {
            for (int p = 0; p < g.n; p++) {
                if (g.links[p].sending || g.links[p].receiving) {
                    return failure(p, "no frame before the exchange's deadline");
                }
            }
        }
        fds.clear();
        for (int p = 0; p < g.n; p++) {
            const Link &l = g.links[p];
            if (!l.sending && !l.receiving) continue;
            fds.push_back({l.fd, (short)((l.receiving ? POLLIN : 0) | (l.sending ? POLLOUT : 0)), 0});
        }
        const auto left = std::chrono::duration_cast<std::chrono::microseconds>(until - now).count();
        const int timeout = (int)std::min<int64_t>((left + 999) / 1000, 1 << 30);
        if (poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
            return failure(-1, std::string("poll: ") + std::strerror(errno));
        }
    }
}

Clock::time_point deadline(const Group &g) { return Clock::now() + std::chrono::milliseconds(g.deadline_ms); }

void close_links(Group &g) {
    for (Link &l : g.links) {
        if (l.fd >= 0) close(l.fd);
        l.fd = -1;
    }
    g.links.clear();
}

}  // namespace

bool attached() { return group().attached.load(std::memory_order_acquire); }
bool failed() { return group().failed.load(std::memory_order_acquire); }
uint64_t generation() { return group().generation.load(std::memory_order_acquire); }
int rank() { return group().rank; }
int size() { return group().n; }

bool vocab_rows(int64_t n_vocab, int64_t *begin, int64_t *end) {
    Group &g = group();
    if (g.cut.empty() || g.cut.back() != n_vocab) return false;
    *begin = g.cut[g.rank];
    *end = g.cut[g.rank + 1];
    return true;
}

void fail(const char *why) {
    Group &g = group();
    std::lock_guard<std::mutex> lock(g.io);
    fail_locked(g, why);
}

// A partial sum's value i as the wire carries it (a double after a 20-byte header: unaligned).
inline double wire_value(const uint8_t *payload, size_t i) {
    double v;
    std::memcpy(&v, payload + i * sizeof(double), sizeof v);
    return v;
}

bool allreduce_add(const double *mine, const float *src1, float *dst, size_t n) {
    Group &g = group();
    std::lock_guard<std::mutex> lock(g.io);
    if (g.failed.load() || !g.attached.load()) return false;
    const size_t bytes = n * sizeof(double);
    if (bytes > kMaxPayload) {
        fail_locked(g, "a partial sum larger than a frame may carry (64 MiB)");
        return false;
    }
    if (g.free_links) {   // the ceiling: each node goes on with its own partial (wrong answers)
        for (size_t i = 0; i < n; i++) dst[i] = (float)mine[i] + src1[i];
        g.exchanges.fetch_add(1, std::memory_order_relaxed);
        g.step++;
        return true;
    }
    for (int p = 0; p < g.n; p++) {
        if (p == g.rank) continue;
        stage_send(g, g.links[p], kKindPartial, mine, bytes);
        stage_receive(g.links[p], kKindPartial, bytes);
    }
    if (!run(g, deadline(g), kKindPartial)) return false;
    // node order, the same additions on every node, in double: ((p0 + p1) + p2) ..., then
    // rounded once to float and + src1 in float, as one node's MUL_MAT and ADD do (tp.h)
    if (g.sum.size() < n) g.sum.resize(n);
    double *sum = g.sum.data();
    for (int p = 0; p < g.n; p++) {
        const uint8_t *wire = p == g.rank ? nullptr : g.links[p].in.data() + kHeaderBytes;
        for (size_t i = 0; i < n; i++) {
            const double part = wire ? wire_value(wire, i) : mine[i];
            sum[i] = p == 0 ? part : sum[i] + part;
        }
    }
    for (size_t i = 0; i < n; i++) dst[i] = (float)sum[i] + src1[i];
    g.exchanges.fetch_add(1, std::memory_order_relaxed);
    g.bytes_sent.fetch_add((kHeaderBytes + bytes + kTagBytes) * (g.n - 1), std::memory_order_relaxed);
    g.step++;
    return true;
}

int gather_candidates() { return group().gather.load(std::memory_order_relaxed); }

bool gather_logits(float *logits, int64_t tokens, size_t stride, const Candidate *candidates) {
    Group &g = group();
    std::lock_guard<std::mutex> lock(g.io);
    if (g.failed.load() || !g.attached.load()) return false;
    const int64_t k_mode = g.gather.load(std::memory_order_relaxed);
    auto rows_of = [&](int r) { return g.cut[r + 1] - g.cut[r]; };
    // candidates per row a node sends: min(K, its rows); 0 on the full path (its rows whole)
    auto k_of = [&](int r) { return k_mode > 0 ? std::min<int64_t>(k_mode, rows_of(r)) : 0; };
    auto block_bytes = [&](int r) {
        return k_mode > 0 ? (size_t)k_of(r) * (size_t)tokens * sizeof(Candidate)
                          : (size_t)rows_of(r) * (size_t)tokens * sizeof(float);
    };
    for (int r = 0; r < g.n; r++) {
        if (block_bytes(r) > kMaxPayload) {
            fail_locked(g, "a block of logits larger than a frame may carry (64 MiB): fewer outputs per step");
            return false;
        }
    }
    if (g.free_links) {   // the ceiling: the leader samples from its own rows and what the row held
        g.exchanges.fetch_add(1, std::memory_order_relaxed);
        g.step++;
        return true;
    }
    if (g.rank != 0 && k_mode > 0 && candidates == nullptr) {
        fail_locked(g, "the candidates path without candidates (the backend's logits node)");
        return false;
    }
    if (g.rank == 0) {
        for (int p = 1; p < g.n; p++) stage_receive(g.links[p], kKindLogits, block_bytes(p));
    } else if (k_mode > 0) {
        stage_send(g, g.links[0], kKindLogits, candidates, block_bytes(g.rank));
    } else {
        const int64_t rows = rows_of(g.rank);
        std::vector<float> &block = g.rows;
        block.resize((size_t)(rows * tokens));
        for (int64_t t = 0; t < tokens; t++) {
            std::memcpy(block.data() + t * rows, logits + t * stride + g.cut[g.rank], rows * sizeof(float));
        }
        stage_send(g, g.links[0], kKindLogits, block.data(), block_bytes(g.rank));
    }
    if (!run(g, deadline(g), kKindLogits)) return false;
    if (g.rank == 0) {
        for (int p = 1; p < g.n; p++) {
            const uint8_t *payload = g.links[p].in.data() + kHeaderBytes;
            if (k_mode == 0) {
                const int64_t rows = rows_of(p);
                const auto *block = reinterpret_cast<const float *>(payload);
                for (int64_t t = 0; t < tokens; t++) {
                    std::memcpy(logits + t * stride + g.cut[p], block + t * rows, rows * sizeof(float));
                }
                continue;
            }
            // each row: node p's range at -inf but its candidates, each checked before it is written
            const int64_t k = k_of(p);
            for (int64_t t = 0; t < tokens; t++) {
                float *row = logits + t * stride;
                std::fill(row + g.cut[p], row + g.cut[p + 1], -INFINITY);
                Candidate prev{};
                for (int64_t i = 0; i < k; i++) {
                    Candidate c;
                    std::memcpy(&c, payload + ((size_t)(t * k + i)) * sizeof(Candidate), sizeof c);
                    char why[192];
                    if (c.token < g.cut[p] || c.token >= g.cut[p + 1]) {
                        std::snprintf(why, sizeof why,
                                      "exchange %llu (logits) failed: node %d: a candidate token %d outside its rows "
                                      "[%lld, %lld)", (unsigned long long)g.step, p, c.token,
                                      (long long)g.cut[p], (long long)g.cut[p + 1]);
                    } else if (c.logit != c.logit || (i > 0 && !(c.logit < prev.logit ||
                                                                   (c.logit == prev.logit && c.token > prev.token)))) {
                        std::snprintf(why, sizeof why,
                                      "exchange %llu (logits) failed: node %d: candidates out of order (or NaN) at "
                                      "row %lld", (unsigned long long)g.step, p, (long long)t);
                    } else {
                        row[c.token] = c.logit;
                        prev = c;
                        continue;
                    }
                    fail_locked(g, why);
                    return false;
                }
            }
        }
        // the gather's bytes are the followers': counted here too, where /metrics reads them
        for (int p = 1; p < g.n; p++) {
            g.bytes_sent.fetch_add(kHeaderBytes + block_bytes(p) + kTagBytes, std::memory_order_relaxed);
        }
    } else {
        g.bytes_sent.fetch_add(kHeaderBytes + block_bytes(g.rank) + kTagBytes, std::memory_order_relaxed);
    }
    (k_mode > 0 ? g.gathers_candidates : g.gathers_full).fetch_add(1, std::memory_order_relaxed);
    g.exchanges.fetch_add(1, std::memory_order_relaxed);
    g.step++;
    return true;
}

}  // namespace stackd::tp

using namespace stackd::tp;

STACKD_API int stackd_tp_attach(int rank, int n, const int *fds, const uint8_t *keys, const int64_t *vocab_cut,
                                int deadline_ms, int spin_us) {
    Group &g = group();
    auto refuse = [&](const std::string &why) {
        set_error(g, why);
        for (int p = 0; fds != nullptr && p < n && n <= (1 << 15); p++) {
            if (p != rank && fds[p] >= 0) close(fds[p]);
        }
        return -1;
    };
    if (n < 1 || n > (1 << 15) || rank < 0 || rank >= n) return refuse("tensor parallelism: rank must be 0..n-1");
    if ((n > 1 && (fds == nullptr || keys == nullptr)) || vocab_cut == nullptr) {
        return refuse("tensor parallelism: fds, keys and vocab_cut are required");
    }
    if (deadline_ms < 1 || spin_us < 0) return refuse("tensor parallelism: deadline_ms >= 1 and spin_us >= 0");
    if (vocab_cut[0] != 0) return refuse("tensor parallelism: vocab_cut starts at 0");
    for (int r = 0; r < n; r++) {
        if (vocab_cut[r + 1] <= vocab_cut[r] || (r + 1 < n && vocab_cut[r + 1] % kVocabBlock != 0)) {
            return refuse("tensor parallelism: vocab_cut must rise, on multiples of 64 rows but its end");
        }
    }
    if (ggml_backend_reg_by_name("STACKD") != stackd::backend_reg()) {
        return refuse("tensor parallelism needs our kernels registered (engine.kernels is off, or the CPU lacks them): "
                      "the exchanges run inside their graphs");
    }
    std::string why;
    if (!crypto_available(&why)) return refuse(why);
    for (int p = 0; p < n; p++) {
        if (p == rank) continue;
        int type = 0;
        socklen_t len = sizeof type;
        sockaddr_storage peer;
        socklen_t peer_len = sizeof peer;
        if (fds[p] < 0 || getsockopt(fds[p], SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM ||
            getpeername(fds[p], reinterpret_cast<sockaddr *>(&peer), &peer_len) != 0) {
            return refuse("tensor parallelism: fds[" + std::to_string(p) + "] is not a connected stream socket");
        }
    }
    std::lock_guard<std::mutex> lock(g.io);
    if (g.attached.load()) return refuse("tensor parallelism: already attached (detach first)");
    g.rank = rank;
    g.n = n;
    g.links.clear();
    g.links.resize(n);
    for (int p = 0; p < n; p++) {
        if (p == rank) continue;
        Link &l = g.links[p];
        l.fd = fds[p];
        if (!l.mac.set_key(keys + (size_t)p * kKeyBytes)) {
            g.links.clear();
            return refuse("tensor parallelism: libcrypto refused a link's key");
        }
        const int one = 1;
        setsockopt(l.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);   // mesh.py set it; a raw fd may not have
        fcntl(l.fd, F_SETFL, fcntl(l.fd, F_GETFL) | O_NONBLOCK);
    }
    g.cut.assign(vocab_cut, vocab_cut + n + 1);
    g.deadline_ms = deadline_ms;
    g.spin_us = spin_us;
    g.step = 0;
    g.exchanges = g.bytes_sent = g.control_frames = g.exchange_ns = 0;
    g.gather = 0;
    g.failed = false;
    set_error(g, "");
    g.generation.fetch_add(1);
    g.attached.store(true, std::memory_order_release);
    return 0;
}

// bench/cluster.py --link-delay-us and --free-links, through the worker's test configuration
// (server/faults.py): each exchange's frames held delay_us (0 to 1 s) before they go; or every
// node computes its shard and sends no partial sum and no logits (control messages still go):
// the speed a split would have over a link that cost nothing (wrong answers).
STACKD_API void stackd_tp_set_test_link(int delay_us, int free_links) {
    Group &g = group();
    g.link_delay_us = std::max(0, std::min(1000000, delay_us));
    g.free_links = free_links != 0;
}

STACKD_API void stackd_tp_detach(void) {
    Group &g = group();
    // wake a follower waiting for a control message (it holds the lock in poll)
    for (Link &l : g.links) {
        if (l.fd >= 0) shutdown(l.fd, SHUT_RDWR);
    }
    std::lock_guard<std::mutex> lock(g.io);
    g.generation.fetch_add(1);   // a graph computing meanwhile fails (tp_backend.cpp, tp_lost)
    g.attached.store(false, std::memory_order_release);
    close_links(g);
    g.cut.clear();
    g.failed = false;
}

STACKD_API int stackd_tp_active(void) { return attached() && !failed(); }
STACKD_API int stackd_tp_failed(void) { return failed(); }

STACKD_API const char *stackd_tp_error(void) {
    Group &g = group();
    static thread_local std::string copy;
    std::lock_guard<std::mutex> lock(g.error_mutex);
    copy = g.error;
    return copy.c_str();
}

STACKD_API int stackd_tp_send_control(const void *data, size_t size) {
    Group &g = group();
    std::lock_guard<std::mutex> lock(g.io);
    if (!g.attached.load() || g.failed.load()) {
        if (!g.attached.load()) set_error(g, "tensor parallelism: not attached");
        return -1;
    }
    if (g.rank != 0) {
        set_error(g, "tensor parallelism: only the leader (rank 0) sends control messages");
        return -1;
    }
    if (size > kMaxControl || (size && data == nullptr)) {
        set_error(g, "tensor parallelism: a control message carries at most 4 MiB");
        return -1;
    }
    for (int p = 1; p < g.n; p++) stage_send(g, g.links[p], kKindControl, data, size);
    if (!run(g, deadline(g), kKindControl)) return -1;
    g.control_frames.fetch_add(1, std::memory_order_relaxed);
    g.bytes_sent.fetch_add((kHeaderBytes + size + kTagBytes) * (g.n - 1), std::memory_order_relaxed);
    g.step++;
    return 0;
}

STACKD_API int stackd_tp_recv_control(const void **data, size_t *size, int timeout_ms) {
    Group &g = group();
    std::lock_guard<std::mutex> lock(g.io);
    if (!g.attached.load() || g.failed.load() || g.rank == 0 || data == nullptr || size == nullptr) {
        if (g.attached.load() && !g.failed.load()) set_error(g, "tensor parallelism: only a follower receives control messages");
        return -1;
    }
    Link &leader = g.links[0];
    pollfd pfd = {leader.fd, POLLIN, 0};
    int ready = 0;
    if (g.spin_us > 0) {   // a group that spins in its exchanges spins here too, kControlSpinUs
        const auto spin_until = Clock::now() + std::chrono::microseconds(kControlSpinUs);
        while ((ready = poll(&pfd, 1, 0)) == 0 && Clock::now() < spin_until) spin_pause();
    }
    if (ready == 0) {
        do {
            ready = poll(&pfd, 1, timeout_ms < 0 ? -1 : timeout_ms);
        } while (ready < 0 && errno == EINTR && timeout_ms < 0);
    }
    if (ready == 0 || (ready < 0 && errno == EINTR)) return 1;   // a signal: as a timeout, the caller asks again
    if (ready < 0) {
        fail_locked(g, std::string("waiting for the leader: poll: ") + std::strerror(errno));
        return -1;
    }
    if (!g.attached.load()) return -1;   // detached meanwhile
    stage_receive(leader, kKindControl, kAnyLength);
    if (!run(g, deadline(g), kKindControl)) return -1;   // a closed link fails here too
    const size_t length = leader.want - kHeaderBytes - kTagBytes;
    g.control.assign(leader.in.data() + kHeaderBytes, leader.in.data() + kHeaderBytes + length);
    *data = g.control.data();
    *size = length;
    g.control_frames.fetch_add(1, std::memory_order_relaxed);
    g.step++;
    return 0;
}

STACKD_API void stackd_tp_counters(uint64_t *exchanges, uint64_t *bytes_sent, uint64_t *control_frames) {
    Group &g = group();
    if (exchanges) *exchanges = g.exchanges.load();
    if (bytes_sent) *bytes_sent = g.bytes_sent.load();
    if (control_frames) *control_frames = g.control_frames.load();
}

// Nanoseconds spent in the partial-sum and logits exchanges since attach (sending, waiting for the
// peers, checking): what tensor parallelism adds to a step beyond the compute it divides.
STACKD_API uint64_t stackd_tp_exchange_ns(void) { return group().exchange_ns.load(); }

STACKD_API int stackd_tp_set_gather(int candidates) {
    Group &g = group();
    if (candidates < 0 || candidates > kMaxCandidates) {
        set_error(g, "tensor parallelism: a logits gather of " + std::to_string(candidates) +
                         " candidates a row (0: rows whole, at most " + std::to_string(kMaxCandidates) + ")");
        return -1;
    }
    g.gather.store(candidates, std::memory_order_relaxed);
    return 0;
}

STACKD_API void stackd_tp_gather_counters(uint64_t *full, uint64_t *candidates) {
    Group &g = group();
    if (full) *full = g.gathers_full.load();
    if (candidates) *candidates = g.gathers_candidates.load();
}

// bench/tp_exchange.py --native: `count` all-reduces of `floats` floats over the attached group,
// each one's wall time in microseconds into us[i]. 0, or -1 when an exchange failed.
STACKD_API int stackd_tp_time_allreduce(int floats, int count, double *us) {
    if (floats < 0 || count < 0 || us == nullptr) return -1;
    std::vector<double> mine((size_t)floats);
    std::vector<float> zero((size_t)floats, 0.0f), out((size_t)floats);
    for (int i = 0; i < floats; i++) mine[(size_t)i] = (double)(i % 17) * 0.25;
    for (int i = 0; i < count; i++) {
        const auto t0 = Clock::now();
        if (!allreduce_add(mine.data(), zero.data(), out.data(), (size_t)floats)) return -1;
        us[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    }
    return 0;
}
