// Plain data passed between the scheduling policy and the engine that applies it.
#pragma once

#include <cstdint>
#include <vector>

#include "status.h"

using token_t = int32_t;

// One sequence's share of a decode step: `n_tokens` consecutive tokens at positions
// [pos0, pos0 + n_tokens), read from the request's prompt, or its last sampled token followed
// by `n_draft` drafted ones (its sched_request's draft, ngram_draft.h), every one with logits.
struct plan_item {
    int64_t id_request;
    int32_t id_slot;
    int32_t pos0;
    int32_t n_tokens;
    bool    is_prompt;     // tokens come from the prompt (prefill) rather than the last sample
    bool    want_logits;   // the last token's logits are sampled this step
    int32_t n_draft = 0;   // drafted tokens after the last sample, verified this step
};

// A slot handed to a request this step; the KV cells of the slot from `n_keep` on are stale.
struct plan_admission {
    int64_t id_request;
    int32_t id_slot;
    int32_t n_keep;        // prompt tokens already in the slot's cache (prefix reuse)
};

struct batch_plan {
    std::vector<plan_admission> admissions;
    std::vector<plan_item>      items;
    std::vector<int64_t>        released;  // cancelled requests, now finished ABORTED
    std::vector<int64_t>        released_waiting;  // those of them that had not left the queue
    std::vector<int64_t>        preempted; // gave their slot back, waiting again (scheduler::preempt)
    int32_t n_tokens = 0;

    bool empty() const { return items.empty(); }
};

// What the engine reports back for an item that wanted logits.
// A drafted item samples at each position in turn: the first `n_accepted` drafted tokens were
// sampled as drafted, `token` is the sample after them (the one that differed, or the next).
struct step_outcome {
    int64_t        id_request;
    token_t        token;
    request_status status;   // RUNNING to go on, or a finished kind
    int32_t        n_accepted = 0;
};
