#include "prompt_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace {

constexpr char kMagic[8] = {'s', 't', 'a', 'c', 'k', 'd', 'k', 'v'};
constexpr uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL, P3 = 0x165667B19E3779F9ULL,
                   P4 = 0x85EBCA77C2B2AE63ULL, P5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t round64(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
inline uint64_t merge64(uint64_t acc, uint64_t v) { return (acc ^ round64(0, v)) * P1 + P4; }
inline uint64_t read64(const uint8_t * p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
inline uint32_t read32(const uint8_t * p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

std::string hex64(uint64_t v) {
    char buf[17];
    snprintf(buf, sizeof(buf), "%016" PRIx64, v);
    return buf;
}

// The header's fields in file order (kHeaderBytes in all).
struct header {
    char     magic[8];
    uint32_t version;
    uint32_t key_len;
    uint32_t n_tokens;
    uint32_t reserved;
    uint64_t state_len;
    uint64_t checksum;
    uint64_t reserved2;
};
static_assert(sizeof(header) == prompt_cache::kHeaderBytes, "the header is 48 bytes");

// The checksum covers the key, the tokens and the state, in that order (one hash, three parts:
// hashed as one buffer would be, without joining them).
uint64_t checksum_of(const std::string & key, const int32_t * tokens, size_t n_tokens,
                     const uint8_t * state, size_t n_state) {
    uint64_t h = prompt_cache_hash(key.data(), key.size(), 1);
    h = prompt_cache_hash(tokens, n_tokens * sizeof(int32_t), h);
    return prompt_cache_hash(state, n_state, h);
}

bool write_all(int fd, const void * data, size_t n) {
    const uint8_t * p = (const uint8_t *) data;
    while (n > 0) {
        const ssize_t k = ::write(fd, p, n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            if (k == 0) {
                errno = ENOSPC;
            }
            return false;
        }
        p += k;
        n -= (size_t) k;
    }
    return true;
}

bool read_all(int fd, void * data, size_t n) {
    uint8_t * p = (uint8_t *) data;
    while (n > 0) {
        const ssize_t k = ::read(fd, p, n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            return false;
        }
        p += k;
        n -= (size_t) k;
    }
    return true;
}

bool ends_with(const std::string & s, const char * suffix) {
    const size_t n = strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

uint64_t prompt_cache_hash(const void * data, size_t n, uint64_t seed) {
    const uint8_t * p = (const uint8_t *) data;
    const uint8_t * end = p + n;
    uint64_t h;
    if (n >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        for (; p + 32 <= end; p += 32) {
            v1 = round64(v1, read64(p));
            v2 = round64(v2, read64(p + 8));
            v3 = round64(v3, read64(p + 16));
            v4 = round64(v4, read64(p + 24));
        }
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = merge64(merge64(merge64(merge64(h, v1), v2), v3), v4);
    } else {
        h = seed + P5;
    }
    h += (uint64_t) n;
    for (; p + 8 <= end; p += 8) {
        h = rotl(h ^ round64(0, read64(p)), 27) * P1 + P4;
    }
    if (p + 4 <= end) {
        h = rotl(h ^ ((uint64_t) read32(p) * P1), 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; ++p) {
        h = rotl(h ^ ((uint64_t) *p * P5), 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

prompt_cache::prompt_cache(prompt_cache_params params) : params_(std::move(params)) {
    key_hex_ = hex64(prompt_cache_hash(params_.key.data(), params_.key.size()));
    if (!enabled()) {
        return;
    }
    if (params_.root.empty()) {
        params_.root = params_.dir;
    }
    ::mkdir(params_.root.c_str(), 0700);
    ::mkdir(params_.dir.c_str(), 0700);
    writer_ = std::thread([this] { run(); });
}

prompt_cache::~prompt_cache() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (writer_.joinable()) {
        writer_.join();
    }
}

std::string prompt_cache::file_name(const std::vector<int32_t> & tokens, size_t n) const {
    return key_hex_ + "-" + std::to_string(n) + "-" +
           hex64(prompt_cache_hash(tokens.data(), n * sizeof(int32_t))) + ".kv";
}

namespace {

// How many leading tokens `a` and `b` share, at most n_max.
int32_t common_prefix(const std::vector<int32_t> & a, const std::vector<int32_t> & b, int32_t n_max) {
    const size_t n = std::min({a.size(), b.size(), (size_t) std::max(0, n_max)});
    size_t i = 0;
    while (i < n && a[i] == b[i]) {
        ++i;
    }
    return (int32_t) i;
}

// A file's head read from `fd` and checked: the header, the sizes it declares adding up to the
// file's (each bounded by it first, so that no sum wraps), the key equal to `key`, then the
// tokens. False on anything amiss; `size` is the file's.
bool read_head_of(int fd, const std::string & key, header & h, uint64_t & size, std::vector<int32_t> & tokens) {
    struct stat st{};
    if (fstat(fd, &st) != 0 || !read_all(fd, &h, sizeof(h))) {
        return false;
    }
    size = (uint64_t) st.st_size;
    if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != prompt_cache::kVersion ||
        h.key_len != key.size() || (uint64_t) h.n_tokens * 4 > size || h.state_len > size ||
        size != prompt_cache::kHeaderBytes + h.key_len + (uint64_t) h.n_tokens * 4 + h.state_len) {
        return false;
    }
    std::string held(h.key_len, '\0');
    tokens.resize(h.n_tokens);
    return read_all(fd, held.data(), held.size()) && held == key && read_all(fd, tokens.data(), tokens.size() * 4);
}

}  // namespace

// A file's head (header, key, tokens) read and checked against this key and the file's size:
// 1 it is ours and whole so far (`tokens` filled), 0 it is damaged or foreign, -1 it is gone.
int prompt_cache::read_head(const std::string & path, std::vector<int32_t> & tokens) const {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    header h{};
    uint64_t size = 0;
    const bool ok = read_head_of(fd, params_.key, h, size, tokens);
    ::close(fd);
    return ok ? 1 : 0;
}

void prompt_cache::refresh_index() {
    DIR * d = opendir(params_.dir.c_str());
    if (d == nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        index_.clear();
        return;
    }
    const std::string prefix = key_hex_ + "-";
    std::set<std::string> present;
    std::vector<std::string> unseen;
    {
        std::lock_guard<std::mutex> lock(mu_);
        while (dirent * e = readdir(d)) {
            const std::string name = e->d_name;
            if (name.compare(0, prefix.size(), prefix) != 0 || !ends_with(name, ".kv")) {
                continue;              // another key's, a temporary file
            }
            present.insert(name);
            if (index_.count(name) == 0) {
                unseen.push_back(name);
            }
        }
        for (auto it = index_.begin(); it != index_.end();) {
            it = present.count(it->first) > 0 ? std::next(it) : index_.erase(it);
        }
    }
    closedir(d);
    for (const std::string & name : unseen) {          // read outside the lock: the writer goes on
        std::vector<int32_t> tokens;
        const std::string path = params_.dir + "/" + name;
        const int head = read_head(path, tokens);
        if (head == 0) {
            reject(path);
        } else if (head > 0 && name == file_name(tokens, tokens.size())) {
            std::lock_guard<std::mutex> lock(mu_);
            index_.emplace(name, std::move(tokens));
        } else if (head > 0) {
            reject(path);              // its tokens are not the ones its name says
        }
    }
}

prompt_cache::found prompt_cache::find(const std::vector<int32_t> & prompt, int32_t longer_than, int32_t n_max) {
    found best;
    if (!enabled()) {
        return best;
    }
    refresh_index();
    n_max = std::min(n_max, (int32_t) prompt.size());
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto & [name, tokens] : index_) {
        const int32_t n_common = common_prefix(tokens, prompt, n_max);
        if (n_common <= longer_than || n_common < params_.min_tokens) {
            continue;
        }
        // The longest shared prefix; of two that share as much, the shorter file (less to read).
        if (n_common > best.n_common || (n_common == best.n_common && (int32_t) tokens.size() < best.n_tokens)) {
            best = {params_.dir + "/" + name, (int32_t) tokens.size(), n_common};
        }
    }
    return best;
}

std::vector<prompt_cache::held> prompt_cache::recent(size_t n, int32_t n_max) {
    std::vector<held> out;
    if (!enabled() || n == 0) {
        return out;
    }
    refresh_index();
    std::vector<std::pair<int64_t, held>> dated;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto & [name, tokens] : index_) {
            const int32_t n_tokens = (int32_t) tokens.size();
            struct stat st{};
            const std::string path = params_.dir + "/" + name;
            if (n_tokens < params_.min_tokens || n_tokens > n_max || ::stat(path.c_str(), &st) != 0) {
                continue;
            }
            dated.push_back({(int64_t) st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
                             {{path, n_tokens, n_tokens}, tokens}});
        }
    }
    std::sort(dated.begin(), dated.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
    for (auto & [mtime, h] : dated) {
        if (out.size() == n) {
            break;
        }
        out.push_back(std::move(h));
    }
    return out;
}

void prompt_cache::reject(const std::string & path) {
    ::unlink(path.c_str());
    counters.rejected += 1;
    std::lock_guard<std::mutex> lock(mu_);
    index_.erase(path.substr(path.rfind('/') + 1));
}

prompt_cache::state_view::~state_view() {
    if (base_ != nullptr) {
        ::munmap(base_, length_);
    }
}

bool prompt_cache::load(const found & f, const std::vector<int32_t> & prompt, state_view & state) {
    if (f.n_tokens <= 0 || f.n_common <= 0 || (size_t) f.n_common > prompt.size()) {
        return false;
    }
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;                  // gone meanwhile (evicted by another process): a miss
    }
    header h{};
    uint64_t size = 0;
    std::vector<int32_t> tokens;
    bool ok = read_head_of(fd, params_.key, h, size, tokens) && (int32_t) h.n_tokens == f.n_tokens &&
              common_prefix(tokens, prompt, f.n_common) == f.n_common;
    if (ok && h.state_len > 0) {
        // The whole file mapped, its pages faulted in at once (MAP_POPULATE: one pass of
        // readahead instead of a fault per page in the checksum's loop).
        void * base = ::mmap(nullptr, (size_t) size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        ok = base != MAP_FAILED;
        if (ok) {
            state.base_ = base;
            state.length_ = (size_t) size;
            state.data_ = (const uint8_t *) base + (size - h.state_len);
            state.size_ = (size_t) h.state_len;
            ok = checksum_of(params_.key, tokens.data(), tokens.size(), state.data_, state.size_) == h.checksum;
        }
    } else if (ok) {
        ok = false;                    // a file with no state restores nothing
    }
    ::close(fd);
    if (!ok) {
        if (state.base_ != nullptr) {
            ::munmap(state.base_, state.length_);
            state.base_ = nullptr;
            state.data_ = nullptr;
            state.size_ = 0;
        }
        reject(f.path);
        return false;
    }
    counters.bytes_read += size;
    ::utimensat(AT_FDCWD, f.path.c_str(), nullptr, 0);   // now: the most recently used
    return true;
}

bool prompt_cache::worth_saving(const std::vector<int32_t> & tokens) {
    const int32_t n = (int32_t) tokens.size();
    if (!enabled() || n < params_.min_tokens) {
        return false;
    }
    refresh_index();
    std::lock_guard<std::mutex> lock(mu_);
    const auto adds_enough = [&](const std::vector<int32_t> & held) {
        return n - common_prefix(held, tokens, n) >= params_.min_tokens;
    };
    for (const auto & [name, held] : index_) {
        if (!adds_enough(held)) {
            return false;
        }
    }
    for (const job & j : queue_) {
        if (!adds_enough(j.tokens)) {
            return false;
        }
    }
    return !writing_ || adds_enough(writing_tokens_);
}

void prompt_cache::save(std::vector<int32_t> tokens, std::vector<uint8_t> state) {
    const uint64_t size = kHeaderBytes + params_.key.size() + tokens.size() * 4 + state.size();
    std::string name = file_name(tokens, tokens.size());
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (pending_.count(name) > 0) {
            return;
        }
        // The queue holds a few files at most (each a copy of a prompt's KV), never more than
        // the budget: a disk slower than the prompts come costs saves, not the engine's memory.
        if (size > params_.max_bytes || queued_bytes_ + size > params_.max_bytes || queue_.size() >= kMaxQueued) {
            counters.saves_skipped += 1;
            return;
        }
        pending_.insert(name);
        queued_bytes_ += size;
        queue_.push_back({std::move(tokens), std::move(state), std::move(name)});
    }
    cv_.notify_all();
}

void prompt_cache::flush() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_idle_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

void prompt_cache::run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) {
            return;                    // stopping, and every queued file is written
        }
        job j = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        writing_tokens_ = j.tokens;
        lock.unlock();
        if (write(j)) {
            drop_extended(j);
        }
        keep_within_budget();
        lock.lock();
        queued_bytes_ -= kHeaderBytes + params_.key.size() + j.tokens.size() * 4 + j.state.size();
        pending_.erase(j.name);
        writing_ = false;
        cv_idle_.notify_all();
    }
}

// The files whose tokens are all at the head of the file just written: any prompt shares at
// least as much with the new one, so they only take room.
void prompt_cache::drop_extended(const job & j) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = index_.begin(); it != index_.end();) {
        const std::vector<int32_t> & held = it->second;
        if (it->first != j.name && held.size() < j.tokens.size() &&
            std::equal(held.begin(), held.end(), j.tokens.begin())) {
            if (::unlink((params_.dir + "/" + it->first).c_str()) == 0) {
                counters.superseded += 1;
            }
            it = index_.erase(it);
        } else {
            ++it;
        }
    }
    index_[j.name] = j.tokens;
}

bool prompt_cache::write(const job & j) {
    const std::string path = params_.dir + "/" + j.name;
    struct stat st{};
    if (::stat(path.c_str(), &st) == 0) {
        return false;                  // another engine of this model wrote it meanwhile
    }
    const uint64_t size = kHeaderBytes + params_.key.size() + j.tokens.size() * 4 + j.state.size();
    struct statvfs vfs{};
    if (params_.disk_reserve > 0 && ::statvfs(params_.dir.c_str(), &vfs) == 0 &&
        (uint64_t) vfs.f_bavail * vfs.f_frsize < size + params_.disk_reserve) {
        counters.saves_skipped += 1;
        fprintf(stderr, "stackd: prompt cache: save of %zu tokens skipped: it would leave less than "
                "the disk reserve free\n", j.tokens.size());
        return false;
    }
    header h{};
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.version = kVersion;
    h.key_len = (uint32_t) params_.key.size();
    h.n_tokens = (uint32_t) j.tokens.size();
    h.state_len = j.state.size();
    h.checksum = checksum_of(params_.key, j.tokens.data(), j.tokens.size(), j.state.data(), j.state.size());
    const std::string tmp = params_.dir + "/." + j.name + "." + std::to_string(getpid()) + ".tmp";
    ::mkdir(params_.dir.c_str(), 0700);     // removed with its model while this engine ran
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write_all(fd, &h, sizeof(h)) && write_all(fd, params_.key.data(), params_.key.size()) &&
              write_all(fd, j.tokens.data(), j.tokens.size() * 4) && write_all(fd, j.state.data(), j.state.size());
    const int err = errno;
    if (fd >= 0) {
        ok = ::close(fd) == 0 && ok;
    }
    ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) {
        ::unlink(tmp.c_str());
        counters.saves_skipped += 1;
        fprintf(stderr, "stackd: prompt cache: save of %zu tokens skipped: %s\n", j.tokens.size(),
                strerror(err != 0 ? err : errno));
        return false;
    }
    counters.saves += 1;
    counters.bytes_written += size;
    return true;
}

// Every model's files (the root's directories) within max_bytes: the oldest mtime out first.
// Temporary files of writes that died with their process are removed once an hour old.
void prompt_cache::keep_within_budget() {
    struct entry { int64_t mtime_ns; uint64_t size; std::string path; };
    std::vector<entry> files;
    uint64_t total = 0;
    const int64_t now_s = (int64_t) time(nullptr);
    std::vector<std::string> dirs;
    if (params_.root == params_.dir) {        // no root given: this model's files alone
        dirs.push_back(params_.dir);
    } else {
        DIR * root = opendir(params_.root.c_str());
        if (root == nullptr) {
            return;
        }
        while (dirent * e = readdir(root)) {
            if (e->d_name[0] != '.') {
                dirs.push_back(params_.root + "/" + e->d_name);
            }
        }
        closedir(root);
    }
    for (const std::string & dir : dirs) {
        DIR * d = opendir(dir.c_str());
        if (d == nullptr) {
            continue;
        }
        while (dirent * e = readdir(d)) {
            const std::string name = e->d_name;
            struct stat st{};
            const std::string path = dir + "/" + name;
            if (!ends_with(name, ".kv") && !ends_with(name, ".tmp")) {
                continue;
            }
            if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
                continue;
            }
            if (ends_with(name, ".tmp")) {
                if (now_s - st.st_mtime > 3600) {
                    ::unlink(path.c_str());
                }
                continue;
            }
            files.push_back({(int64_t) st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec, (uint64_t) st.st_size, path});
            total += (uint64_t) st.st_size;
        }
        closedir(d);
    }
    if (total <= params_.max_bytes) {
        return;
    }
    std::sort(files.begin(), files.end(), [](const entry & a, const entry & b) { return a.mtime_ns < b.mtime_ns; });
    for (const entry & f : files) {
        if (total <= params_.max_bytes) {
            break;
        }
        if (::unlink(f.path.c_str()) == 0) {
            counters.evictions += 1;
        }
        total -= f.size;
    }
}
