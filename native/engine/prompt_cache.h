// The prompt cache on disk: the KV state of long prompt prefixes, kept in files so that a later
// request starting with one skips its prefill, after the model was unloaded, its worker
// restarted or the daemon rebooted. It knows files and bytes, nothing of llama.cpp: the engine
// copies a sequence's state out (llama_state_seq_get_data) and hands it here, and gives what it
// finds here back to llama_state_seq_set_data (engine_prompt_cache.cpp).
//
// A file is <dir>/<key hash>-<token count>-<tokens' hash>.kv. The cache keeps an index of the
// tokens each of its key's files holds (read from a file's head once, when it first appears in
// the directory), so that a lookup finds the file sharing the longest prefix with a prompt,
// whole or not: the state is restored, and the sequence cut where the two part (as a slot's
// prefix reuse in memory does). A prompt is saved only when it would add at least min_tokens
// tokens to what the files hold already (a system prompt with each request's own question
// keeps one file, not one per question); a file that a newer one extends is removed. Its
// content:
//
//   header (48 bytes, little-endian)   magic "stackdkv", version, key length, token count,
//                                      reserved, state length, checksum (of all that follows)
//   key (key length bytes)             what the KV depends on: the model's digest, the KV
//                                      type, the context layout, the kernels (engine.h)
//   tokens (token count int32)         the prefix the state holds, compared with the prompt
//   state (state length bytes)         llama_state_seq_get_data's bytes
//
// Every read checks all of it: a truncated, damaged or foreign file is a miss, and is removed.
// Writes go through one thread of the cache's own (a queue of two whole files at most),
// into a temporary file renamed into place: a step never waits for a disk, and a file seen
// under its name is whole, or found damaged by the checks (no fsync: after a power cut a
// renamed file may be empty, which the checks catch). After each write the files of every
// model (the root) are kept within the budget, the least recently used (mtime, touched by
// each hit) out first. A save that fails (a full disk) is skipped and logged, never an error.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

struct prompt_cache_params {
    std::string dir;              // this model's files; "" turns the cache off
    std::string root;             // every model's directories: the budget is over all of them
    std::string key;              // what the saved KV depends on (see above)
    int32_t     min_tokens = 512; // prefixes shorter than this are never saved
    uint64_t    max_bytes = 0;    // the root's files at most; 0 turns the cache off
    uint64_t    disk_reserve = 0; // free disk a save must leave
};

struct prompt_cache_counters {
    std::atomic<uint64_t> hits{0};           // admissions whose prefix came from a file
    std::atomic<uint64_t> misses{0};         // admissions that looked and found none usable
    std::atomic<uint64_t> rejected{0};       // files found truncated, damaged or foreign (removed)
    std::atomic<uint64_t> bytes_read{0};
    std::atomic<uint64_t> bytes_written{0};
    std::atomic<uint64_t> saves{0};          // files written
    std::atomic<uint64_t> saves_skipped{0};  // saves not made: a write failed, no room, queue full
    std::atomic<uint64_t> evictions{0};      // files removed to keep within the budget
    std::atomic<uint64_t> superseded{0};     // files removed because a newer one extends them
    std::atomic<uint64_t> restored_tokens{0};
    std::atomic<uint64_t> restore_us{0};     // time from lookup to the state in the sequence
    std::atomic<uint64_t> preloads{0};       // files put into idle slots at load
    std::atomic<uint64_t> preloaded_tokens{0};
};

// 64-bit hash over bytes (xxHash64's mixing, four lanes): the file's checksum and the name's
// token hash. A flipped bit anywhere changes it.
uint64_t prompt_cache_hash(const void * data, size_t n, uint64_t seed = 0);

class prompt_cache {
public:
    static constexpr uint32_t kVersion = 1;
    static constexpr size_t   kHeaderBytes = 48;
    static constexpr size_t   kMaxQueued = 2;     // files waiting for the writer at most

    explicit prompt_cache(prompt_cache_params params);
    ~prompt_cache();              // writes still queued are finished first
    prompt_cache(const prompt_cache &) = delete;
    prompt_cache & operator=(const prompt_cache &) = delete;

    bool enabled() const { return !params_.dir.empty() && params_.max_bytes > 0; }
    const prompt_cache_params & params() const { return params_; }

    // The file sharing the longest prefix with `prompt`, of more than `longer_than` tokens, at
    // least min_tokens, at most `n_max`: its path, its token count and the prefix it shares
    // (n_common), or n_common 0. Lists the directory; opens only files not yet indexed.
    struct found { std::string path; int32_t n_tokens = 0; int32_t n_common = 0; };
    found find(const std::vector<int32_t> & prompt, int32_t longer_than, int32_t n_max);
    // The `n` most recently used files (mtime, newest first) of at most `n_max` tokens, each
    // with the tokens it holds (n_common is all of them): what a load puts back into its slots.
    struct held { found file; std::vector<int32_t> tokens; };
    std::vector<held> recent(size_t n, int32_t n_max);
    // A file's state bytes, mapped from the page cache (no copy, no zero-filled buffer: the
    // restore's one copy is llama.cpp's into the KV cells); unmapped with the object.
    class state_view {
    public:
        state_view() = default;
        ~state_view();
        state_view(const state_view &) = delete;
        state_view & operator=(const state_view &) = delete;
        const uint8_t * data() const { return data_; }
        size_t size() const { return size_; }
    private:
        friend class prompt_cache;
        void * base_ = nullptr;
        size_t length_ = 0;
        const uint8_t * data_ = nullptr;
        size_t size_ = 0;
    };
    // Reads and checks the file found for `prompt`: its state into `state`. False (and the file
    // removed) on anything amiss; true touches its mtime (least recently used goes first). A
    // file is never changed in place (writes are renamed into place), so the mapping holds.
    bool load(const found & f, const std::vector<int32_t> & prompt, state_view & state);
    // Whether a file of these tokens would hold min_tokens or more that no file (saved or on
    // its way) shares with them.
    bool worth_saving(const std::vector<int32_t> & tokens);
    // Queue a file of `tokens` and their `state`. Skipped (counted) when the queue is full
    // (kMaxQueued, or the budget's bytes), or the file could never fit the budget.
    void save(std::vector<int32_t> tokens, std::vector<uint8_t> state);
    // Returns once every queued write is done (tests, and the engine's close).
    void flush();
    // A file found unusable (damaged, foreign, or a state llama.cpp refused): removed, counted,
    // and out of the index.
    void reject(const std::string & path);

    prompt_cache_counters counters;

    // The file name of a prefix (no directory).
    std::string file_name(const std::vector<int32_t> & tokens, size_t n) const;

private:
    struct job {
        std::vector<int32_t> tokens;
        std::vector<uint8_t> state;
        std::string name;
    };
    void run();
    bool write(const job & j);
    void refresh_index();         // the index as the directory is now (called under no lock)
    int read_head(const std::string & path, std::vector<int32_t> & tokens) const;
    void drop_extended(const job & j);   // the files `j` extends, removed
    void keep_within_budget();

    prompt_cache_params params_;
    std::string key_hex_;         // the key's hash, the names' first part
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::condition_variable cv_idle_;
    std::deque<job> queue_;
    std::set<std::string> pending_;    // names queued or being written
    std::map<std::string, std::vector<int32_t>> index_;   // file name -> the tokens it holds
    uint64_t queued_bytes_ = 0;
    bool writing_ = false;
    std::vector<int32_t> writing_tokens_;   // the file being written's (worth_saving sees it)
    bool stop_ = false;
    std::thread writer_;
};
