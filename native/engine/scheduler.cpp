#include "scheduler.h"

#include <algorithm>
#include <cstdint>

#include "ngram_draft.h"

scheduler::scheduler(scheduler_params params) : params_(params), slots_(params.n_slots) {}

bool scheduler::enqueue(std::unique_ptr<sched_request> req) {
    if ((int32_t) waiting_.size() >= params_.n_max_waiting || req->prompt.empty()) {
        return false;
    }
    const int64_t id = req->id_request;
    requests_[id] = std::move(req);
    waiting_.push_back(id);
    return true;
}

bool scheduler::cancel(int64_t id_request) {
    sched_request * req = find(id_request);
    if (req == nullptr || request_status_is_finished(req->status)) {
        return false;
    }
    req->cancel_requested = true;
    return true;
}

sched_request * scheduler::find(int64_t id_request) {
    auto it = requests_.find(id_request);
    return it == requests_.end() ? nullptr : it->second.get();
}

int32_t scheduler::n_waiting_preempted() const {
    int32_t n = 0;
    for (int64_t id : waiting_) {
        n += requests_.at(id)->preempted ? 1 : 0;
    }
    return n;
}

int32_t scheduler::n_running() const {
    return (int32_t) running_.size();
}

void scheduler::release(int64_t id_request) {
    requests_.erase(id_request);
}

void scheduler::fail(int64_t id_request) {
    sched_request * req = find(id_request);
    if (req == nullptr || req->id_slot < 0) {
        return;
    }
    slots_[req->id_slot].cache.clear();
    finish(*req, REQUEST_STATUS_FINISHED_ERROR);
}

// Shrinks a count kept per owner, forgetting owners that reach zero (the maps stay small).
static void count_down(std::unordered_map<int64_t, int32_t> & counts, int64_t owner) {
    auto it = counts.find(owner);
    if (it != counts.end() && --it->second <= 0) {
        counts.erase(it);
    }
}

void scheduler::finish(sched_request & req, request_status status) {
    req.status = status;
    if (req.id_slot >= 0) {
        slots_[req.id_slot].id_request = -1;   // the cache stays: a later prompt may reuse it
        req.id_slot = -1;
        count_down(n_running_of_, req.id_owner);
    }
    running_.erase(std::remove(running_.begin(), running_.end(), req.id_request), running_.end());
}

// Cancelled requests leave before anything else happens in a step.
void scheduler::release_finished(batch_plan & plan) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        sched_request & req = *requests_[*it];
        if (req.cancel_requested) {
            req.status = REQUEST_STATUS_FINISHED_ABORTED;
            plan.released.push_back(req.id_request);
            plan.released_waiting.push_back(req.id_request);
            it = waiting_.erase(it);
        } else {
            ++it;
        }
    }
    const std::vector<int64_t> running = running_;
    for (int64_t id : running) {
        sched_request & req = *requests_[id];
        if (req.cancel_requested) {
            finish(req, REQUEST_STATUS_FINISHED_ABORTED);
            plan.released.push_back(id);
        }
    }
}

// The free slot whose cache shares the longest prefix with the prompt, among those the prompt
// would keep at least half of (an empty slot keeps all of its nothing); ties go to the least
// recently used, so hot caches survive longest. A slot the prompt shares only a little with
// (the chat template's first tokens, a short common header) is not taken while such a one is
// free: it would lose a long prefix another turn may need for a few tokens of reuse. When every
// free slot is such a one, the least recently used goes.
int32_t scheduler::pick_slot(const std::vector<token_t> & prompt, int32_t & n_common) const {
    int32_t best = -1, lru = -1;
    int32_t n_lru = 0;
    n_common = 0;
    for (int32_t i = 0; i < (int32_t) slots_.size(); ++i) {
        const slot_info & s = slots_[i];
        if (s.id_request >= 0) {
            continue;
        }
        const size_t n_max = std::min(s.cache.size(), prompt.size());
        int32_t n = 0;
        while ((size_t) n < n_max && s.cache[n] == prompt[n]) {
            ++n;
        }
        if (lru < 0 || s.t_last_used < slots_[lru].t_last_used) {
            lru = i;
            n_lru = n;
        }
        if (2 * (size_t) n < s.cache.size()) {
            continue;                  // the prompt would keep less than half of it
        }
        if (best < 0 || n > n_common || (n == n_common && s.t_last_used < slots_[best].t_last_used)) {
            best = i;
            n_common = n;
        }
    }
    if (best < 0) {
        n_common = n_lru;
        return lru;
    }
    return best;
}

// Under its share an owner is admitted in queue order. Past it, only while no owner under
// its share is waiting: then the slots would stand idle otherwise.
bool scheduler::may_admit(const sched_request & req, bool respect_share) const {
    const int32_t cap = params_.n_max_slots_per_owner;
    if (!respect_share || cap <= 0) {
        return true;
    }
    auto held = n_running_of_.find(req.id_owner);
    return held == n_running_of_.end() || held->second < cap;
}

// A request of an owner under its share waits and no slot is free (an owner over its share took
// them while nobody else waited): the owner holding the most slots over its share gives one
// back, so a bystander never waits for a flood's longest generation. The preempted request
// keeps its place at the head of the queue and is recomputed when admitted again (vLLM's
// preemption by recomputation): its slot's tokens and its last sample become its prompt, and
// prefix reuse keeps what the slot still holds. Owners at or under their share are never
// preempted, so two owners cannot take a slot back and forth.
void scheduler::preempt(batch_plan & plan) {
    const int32_t cap = params_.n_max_slots_per_owner;
    if (cap <= 0 || waiting_.empty()) {
        return;
    }
    int32_t n_free = 0;
    for (const slot_info & s : slots_) {
        n_free += s.id_request < 0 ? 1 : 0;
    }
    if (n_active_slots_ > 0) {
        n_free = std::min(n_free, n_active_slots_ - (int32_t) running_.size());
    }
    std::unordered_map<int64_t, int32_t> held = n_running_of_;    // as admit(respect_share) will leave it
    const std::deque<int64_t> waiting = waiting_;
    for (int64_t id : waiting) {
        const sched_request & req = *requests_[id];
        if (held[req.id_owner] >= cap) {
            continue;                   // admitted, if at all, only into a slot nobody wants
        }
        held[req.id_owner] += 1;
        if (n_free > 0) {
            --n_free;
            continue;
        }
        // The owner furthest over its share (the lowest id of equals). An owner id is any
        // int64 (a key's hash, negative for half of all keys), so no id can mean "none".
        bool found = false;
        int64_t over = 0;
        for (const auto & [owner, n] : held) {
            if (n > cap && (!found || n > held[over] || (n == held[over] && owner < over))) {
                over = owner;
                found = true;
            }
        }
        if (!found) {
            return;                     // nobody is over its share: wait for a slot to end
        }
        held[over] -= 1;
        suspend(*requests_[victim_of(over)], plan);
    }
}

// The owner's running request that loses least by starting over: the fewest tokens computed,
// the latest admitted among equals.
int64_t scheduler::victim_of(int64_t id_owner) const {
    int64_t victim = -1;
    size_t fewest = SIZE_MAX;
    for (int64_t id : running_) {
        const sched_request & req = *requests_.at(id);
        const size_t n = slots_[req.id_slot].cache.size();
        if (req.id_owner == id_owner && n <= fewest) {
            victim = id;
            fewest = n;
        }
    }
    return victim;
}

void scheduler::suspend(sched_request & req, batch_plan & plan) {
    const std::vector<token_t> & cache = slots_[req.id_slot].cache;
    if (req.n_prompt_done == (int32_t) req.prompt.size() && req.n_generated > 0) {
        req.prompt = cache;             // prompt and output but the last sample, then that one
        req.prompt.push_back(req.last_token);
    }
    finish(req, REQUEST_STATUS_WAITING);
    req.n_prompt_done = 0;
    req.preempted = true;
    waiting_.push_front(req.id_request);
    plan.preempted.push_back(req.id_request);
}

void scheduler::admit(batch_plan & plan, bool respect_share) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        sched_request & req = *requests_[*it];
        if (!may_admit(req, respect_share)) {
            ++it;                       // keeps its place in the queue
            continue;
        }
        if (n_active_slots_ > 0 && (int32_t) running_.size() >= n_active_slots_) {
            return;
        }
        int32_t n_common = 0;
        const int32_t id_slot = pick_slot(req.prompt, n_common);
        if (id_slot < 0) {
            return;
        }
        it = waiting_.erase(it);
        n_running_of_[req.id_owner] += 1;
        // At least the last prompt token is decoded again: its logits give the first sample.
        const int32_t n_keep = std::min(n_common, (int32_t) req.prompt.size() - 1);
        slot_info & s = slots_[id_slot];
        s.cache.resize(n_keep);
        s.id_request = req.id_request;
        s.t_last_used = n_steps_;
        req.status = REQUEST_STATUS_RUNNING;
        req.id_slot = id_slot;
        if (!req.preempted) {
            req.n_cached = n_keep;      // a resumed request reports the reuse of its first admission
        }
        req.n_prompt_done = n_keep;
        running_.push_back(req.id_request);
        plan.admissions.push_back({req.id_request, id_slot, n_keep});
    }
}

void scheduler::restored(batch_plan & plan, int64_t id_request, int32_t n_keep) {
    sched_request * req = find(id_request);
    if (req == nullptr || req->id_slot < 0) {
        return;
    }
    const int32_t n_prompt = (int32_t) req->prompt.size();
    n_keep = std::max(0, std::min(n_keep, n_prompt - 1));
    slots_[req->id_slot].cache.assign(req->prompt.begin(), req->prompt.begin() + n_keep);
    if (!req->preempted) {
        req->n_cached = n_keep;
    }
    req->n_prompt_done = n_keep;
    for (plan_admission & adm : plan.admissions) {
        if (adm.id_request == id_request) {
            adm.n_keep = n_keep;
        }
    }
    // Its chunk starts where the restored prefix ends, no longer than it was (the step's budget).
    for (plan_item & item : plan.items) {
        if (item.id_request == id_request && item.is_prompt) {
            const int32_t n = std::min(item.n_tokens, n_prompt - n_keep);
            plan.n_tokens -= item.n_tokens - n;
            item.pos0 = n_keep;
            item.n_tokens = n;
            item.want_logits = n_keep + n == n_prompt;
        }
    }
}

void scheduler::preloaded(int32_t id_slot, std::vector<token_t> tokens) {
    if (id_slot < 0 || id_slot >= (int32_t) slots_.size() || slots_[id_slot].id_request >= 0) {
        return;
    }
    slots_[id_slot].cache = std::move(tokens);
    slots_[id_slot].t_last_used = 0;
}

// Which running requests (parallel to running_) take part in this step.
std::vector<bool> scheduler::stepping() {
    if (!params_.share_time) {
        return std::vector<bool>(running_.size(), true);
    }
    std::vector<share_candidate> candidates;
    for (int64_t id : running_) {
        const sched_request & req = *requests_[id];
        candidates.push_back({req.id_owner, req.n_step_last, req.cost_us});
    }
    return share_.select(candidates);
}

batch_plan scheduler::schedule() {
    batch_plan plan;
    ++n_steps_;
    release_finished(plan);
    preempt(plan);
    admit(plan, true);
    admit(plan, false);

    const std::vector<bool> steps = stepping();
    int32_t budget = params_.n_batch;
    // Running streams first: one token each, so a new prompt never starves them.
    for (size_t i = 0; i < running_.size(); ++i) {
        sched_request & req = *requests_[running_[i]];
        if (steps[i] && req.n_prompt_done == (int32_t) req.prompt.size() && budget > 0) {
            const int32_t pos = (int32_t) slots_[req.id_slot].cache.size();
            plan.items.push_back({req.id_request, req.id_slot, pos, 1, false, true});
            req.n_step_last = n_steps_;
            --budget;
        }
    }
    // Then prompt chunks, first come first served, within what is left of the step.
    for (size_t i = 0; i < running_.size(); ++i) {
        sched_request & req = *requests_[running_[i]];
        const int32_t n_left = (int32_t) req.prompt.size() - req.n_prompt_done;
        if (steps[i] && n_left > 0 && budget > 0) {
            const int32_t n = std::min(n_left, budget);
            plan.items.push_back({req.id_request, req.id_slot, req.n_prompt_done, n, true, n == n_left});
            req.n_step_last = n_steps_;
            budget -= n;
        }
    }
    plan.n_tokens = params_.n_batch - budget;
    add_drafts(plan);
    in_slot_order(plan);
    return plan;
}

// The items by slot, lowest first. Each slot is a KV stream of its own, and llama.cpp puts in one
// ubatch (one pass over the weights) only sequences whose ids rise by one from item to item
// (split_equal, sequential): in admission order, sixteen running slots could make two or more
// passes a step (one request whose slot came back out of order; bench/README.md, "Issue 23's
// 16-stream targets"). Drafts were handed out in running
// order before this, so which request drafts first does not change.
void scheduler::in_slot_order(batch_plan & plan) {
    std::stable_sort(plan.items.begin(), plan.items.end(),
                     [](const plan_item & a, const plan_item & b) { return a.id_slot < b.id_slot; });
}

// Drafts never take a request past its max_tokens or its context: verified in full, a draft
// gives its tokens and one more sample.
void scheduler::add_drafts(batch_plan & plan) {
    int32_t room = std::min(params_.n_draft_step_tokens, params_.n_batch) - plan.n_tokens;
    // A lone sequence's drafts ride on a pass over the weights it makes anyway (decode reads
    // every weight for one row or eight); beside other sequences they take the step's compute.
    const bool shared = std::count_if(plan.items.begin(), plan.items.end(),
                                      [](const plan_item & it) { return !it.is_prompt; }) > 1;
    for (plan_item & item : plan.items) {
        if (params_.n_draft_max <= 0 || room <= 0) {
            return;
        }
        sched_request & req = *requests_[item.id_request];
        req.draft.clear();
        if (item.is_prompt || !req.may_draft || (shared && req.n_generated < req.n_draft_rest_until)) {
            continue;
        }
        const std::vector<token_t> & cache = slots_[item.id_slot].cache;
        const int32_t n_max = std::min({params_.n_draft_max, room,
                                        req.limits.n_max_tokens - req.n_generated - 1,
                                        params_.n_ctx_seq - (int32_t) cache.size() - 2});
        req.draft = ngram_draft(cache, req.last_token, n_max);
        item.n_draft = (int32_t) req.draft.size();
        item.n_tokens += item.n_draft;
        plan.n_tokens += item.n_draft;
        room -= item.n_draft;
    }
}

// Drafts pay only while they are accepted: beside other sequences a rejected one costs its rows
// of the step's compute and gives nothing. Every k_draft_judge_tokens drafted tokens a sequence
// is judged; under a quarter accepted, it drafts nothing for its next k_draft_rest_tokens tokens
// while other sequences share its steps, then tries again (what it generates may start copying
// later). A sequence alone in its steps always drafts (add_drafts). Two replicas of 8 streams each
// drafted into every half-empty step with few drafts accepted, and fell below one node
// (bench/README.md, "Cluster: replicas at 16 clients"). Output is the same either way: a draft only
// ever changes how many tokens a step verifies.
static constexpr int32_t k_draft_judge_tokens = 16;
static constexpr int32_t k_draft_rest_tokens = 64;

static void judge_drafts(sched_request & req, int32_t n_drafted, int32_t n_accepted) {
    if (n_drafted <= 0) {
        return;
    }
    req.n_draft_recent += n_drafted;
    req.n_draft_recent_accepted += n_accepted;
    if (req.n_draft_recent < k_draft_judge_tokens) {
        return;
    }
    if (req.n_draft_recent_accepted * 4 < req.n_draft_recent) {
        req.n_draft_rest_until = req.n_generated + k_draft_rest_tokens;
    }
    req.n_draft_recent = 0;
    req.n_draft_recent_accepted = 0;
}

void scheduler::charge(const batch_plan & plan, int64_t decode_us, const std::vector<int64_t> & sample_us) {
    if (!params_.share_time || plan.n_tokens <= 0) {
        return;
    }
    for (size_t i = 0; i < plan.items.size(); ++i) {
        const plan_item & item = plan.items[i];
        sched_request * req = find(item.id_request);
        if (req == nullptr) {
            continue;
        }
        const int64_t us = decode_us * item.n_tokens / plan.n_tokens + (i < sample_us.size() ? sample_us[i] : 0);
        req->cost_us = share_.charge(req->id_owner, us, !item.is_prompt, req->cost_us);
    }
}

std::vector<int64_t> scheduler::apply(const batch_plan & plan, const std::vector<step_outcome> & outcomes) {
    for (const plan_item & item : plan.items) {
        sched_request * req = find(item.id_request);
        if (req == nullptr || req->id_slot != item.id_slot) {
            continue;
        }
        std::vector<token_t> & cache = slots_[item.id_slot].cache;
        if (item.is_prompt) {
            cache.insert(cache.end(), req->prompt.begin() + item.pos0,
                         req->prompt.begin() + item.pos0 + item.n_tokens);
            req->n_prompt_done += item.n_tokens;
        } else {
            cache.push_back(req->last_token);
        }
        slots_[item.id_slot].t_last_used = n_steps_;
    }
    std::vector<int64_t> finished;
    for (const step_outcome & out : outcomes) {
        sched_request * req = find(out.id_request);
        if (req == nullptr || request_status_is_finished(req->status)) {
            continue;
        }
        if (out.n_accepted > 0) {             // drafted tokens sampled as drafted: now in the KV
            std::vector<token_t> & cache = slots_[req->id_slot].cache;
            cache.insert(cache.end(), req->draft.begin(), req->draft.begin() + out.n_accepted);
        }
        req->n_drafted += (int32_t) req->draft.size();
        req->n_draft_accepted += out.n_accepted;
        judge_drafts(*req, (int32_t) req->draft.size(), out.n_accepted);
        req->draft.clear();
        req->last_token = out.token;
        req->n_generated += 1 + out.n_accepted;
        request_status status = out.status;
        if (!request_status_is_finished(status)) {
            const int32_t n_cached = (int32_t) slots_[req->id_slot].cache.size();
            // The cache holds the prompt and every generated token but the newest, so prompt +
            // completion == n_cached + 1: stop when that fills the context.
            if (req->n_generated >= req->limits.n_max_tokens || n_cached + 1 >= params_.n_ctx_seq) {
                status = REQUEST_STATUS_FINISHED_LENGTH;
            }
        }
        if (request_status_is_finished(status)) {
            finish(*req, status);
            finished.push_back(out.id_request);
        }
    }
    return finished;
}
