// The continuous-batching policy: admission into slots, chunked prefill, prefix reuse,
// cancellation. It knows nothing of llama.cpp: schedule() turns state into a batch_plan,
// apply() folds the decoder's outcomes back in. Tests drive it with a fake decoder.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "plan.h"
#include "time_share.h"

struct request_limits {
    int32_t n_max_tokens = 16;   // tokens to generate at most
};

struct sched_request {
    int64_t              id_request;
    int64_t              id_owner     = 0;  // who asked (an API key): the unit of fair share
    std::vector<token_t> prompt;
    request_limits       limits;
    request_status       status       = REQUEST_STATUS_WAITING;
    int32_t              id_slot      = -1;
    int32_t              n_cached     = 0;  // prompt tokens reused from the slot's cache
    int32_t              n_prompt_done = 0; // prompt tokens whose KV is computed
    int32_t              n_generated  = 0;
    token_t              last_token   = -1;
    bool                 cancel_requested = false;
    uint64_t             n_step_last  = 0;  // the last step it took part in
    int64_t              cost_us      = 0;  // what one of its decode steps cost lately
    bool                 preempted    = false;  // gave its slot back once: a re-admission resumes it
    bool                 may_draft    = true;  // the request did not opt out of drafting
    std::vector<token_t> draft;             // this step's drafted tokens (plan_item::n_draft)
    int32_t              n_drafted    = 0;  // drafted tokens verified, over the request's life
    int32_t              n_draft_accepted = 0;
    int32_t              n_draft_recent = 0;           // drafted since drafting was last judged
    int32_t              n_draft_recent_accepted = 0;
    int32_t              n_draft_rest_until = 0;       // drafts nothing until it has generated this many
};

struct slot_info {
    int64_t              id_request = -1;   // -1: free
    std::vector<token_t> cache;             // tokens whose KV is in this slot's sequence
    uint64_t             t_last_used = 0;   // step counter, for least-recently-used choice
};

struct scheduler_params {
    int32_t n_slots   = 4;     // parallel sequences
    int32_t n_batch   = 512;   // tokens per decode step at most
    int32_t n_ctx_seq = 2048;  // context per sequence
    int32_t n_max_waiting = 256;
    // While another owner waits, one owner is admitted into at most this many slots (its
    // further requests keep their place in the queue). 0: no limit.
    int32_t n_max_slots_per_owner = 0;
    // While several owners run, share the engine's time equally between them (time_share.h).
    bool share_time = false;
    // Draftless speculative decoding (ngram_draft.h): drafted tokens per sequence and step at
    // most (0: off), and the step's token count (samples, prompt chunks and drafts) that drafts
    // may fill up to. On a CPU a step's cost grows with its tokens, so a step that already has
    // many is where verification costs more than it saves: drafts go to sequences in admission
    // order while the step stays within the bound, and not at all past it.
    int32_t n_draft_max = 0;
    int32_t n_draft_step_tokens = 16;
};

class scheduler {
public:
    explicit scheduler(scheduler_params params);

    // Queue a request; false when the waiting queue is full.
    bool enqueue(std::unique_ptr<sched_request> req);
    // Cancel a request; it finishes ABORTED at the next schedule(). False if unknown.
    bool cancel(int64_t id_request);

    batch_plan schedule();
    // Fold a step's outcomes in. Returns the requests that finished in this step.
    std::vector<int64_t> apply(const batch_plan & plan, const std::vector<step_outcome> & outcomes);

    // What the step of `plan` cost: its decode (shared by tokens) and each item's sample
    // (`sample_us`, parallel to plan.items), charged to the owners (share_time only).
    void charge(const batch_plan & plan, int64_t decode_us, const std::vector<int64_t> & sample_us);

    // Forget a finished request (after the engine has emitted its last event).
    void release(int64_t id_request);
    // End a running request with an error, and forget what its slot's cache held: its KV is
    // gone (the engine clears the sequence), so prefix reuse must not trust it any more.
    void fail(int64_t id_request);
    // The engine put the KV of the prompt's first `n_keep` tokens into the request's slot at
    // its admission in `plan` (the prompt cache on disk; 0: what the slot held is gone): the
    // slot's cache, the request's progress, and its admission and prompt chunk in `plan` follow.
    void restored(batch_plan & plan, int64_t id_request, int32_t n_keep);
    // The engine put the KV of `tokens` into free slot `id_slot` while no request held it (a
    // load's preload from the prompt cache): prefix reuse finds them as a past request's. Its
    // last use is the oldest, so it is the first a prompt with nothing in common displaces.
    void preloaded(int32_t id_slot, std::vector<token_t> tokens);
    // Power budget: admit into at most `n` slots at once (running requests keep theirs).
    void set_active_slots(int32_t n) { n_active_slots_ = n; }

    sched_request *       find(int64_t id_request);
    const slot_info &     slot(int32_t id_slot) const { return slots_[id_slot]; }
    int32_t               n_waiting() const { return (int32_t) waiting_.size(); }
    // Waiting again after giving their slot back (preempted): the engine's queue count no
    // longer has them, the waiting gauge must.
    int32_t               n_waiting_preempted() const;
    int32_t               n_running() const;
    bool                  idle() const { return waiting_.empty() && n_running() == 0; }
    const scheduler_params & params() const { return params_; }

private:
    void    preempt(batch_plan & plan);
    int64_t victim_of(int64_t id_owner) const;
    void    suspend(sched_request & req, batch_plan & plan);
    void    admit(batch_plan & plan, bool respect_share);
    void    add_drafts(batch_plan & plan);
    static void in_slot_order(batch_plan & plan);
    std::vector<bool> stepping();
    bool    may_admit(const sched_request & req, bool respect_share) const;
    void    release_finished(batch_plan & plan);
    int32_t pick_slot(const std::vector<token_t> & prompt, int32_t & n_common) const;
    void    finish(sched_request & req, request_status status);

    scheduler_params params_;
    std::vector<slot_info> slots_;
    std::deque<int64_t> waiting_;
    std::vector<int64_t> running_;   // in admission order: prefill goes first-come first-served
    std::unordered_map<int64_t, int32_t> n_running_of_;   // owner -> slots held
    std::unordered_map<int64_t, std::unique_ptr<sched_request>> requests_;
    time_share share_;
    uint64_t n_steps_ = 0;
    int32_t n_active_slots_ = 0;     // 0: all of them
};
