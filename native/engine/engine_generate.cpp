// The engine's generate step (engine.h): one turn of a lane's loop for a generative model.
// The scheduler's plan is decoded as one batch, the prompt log-probabilities asked for are
// taken from its rows, every row that wants a token is sampled (drafts verified position after
// position), and the step's events are published; a plan whose decode fails ends its requests.
#include "engine.h"
#include "engine_steps.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

void engine::step_generate(lane & ln) {
    engine_stats delta;
    uint64_t t0 = now_us();
    batch_plan plan = ln.sched.schedule();
    restore_prefixes(ln, plan);                        // the prompt cache on disk
    std::vector<engine_event> events;

    for (const plan_admission & adm : plan.admissions) {
        if (!ln.sched.find(adm.id_request)->preempted) {   // a resumed one was counted already
            leave_queue();
            obs_.admitted(adm);
        }
        tp_->seq_rm(ln.ctx, adm.id_slot, adm.n_keep, -1);
    }
    for (const plan_admission & adm : plan.admissions) {
        const int32_t rc = recompute_prefix(ln, adm);
        if (rc != 0) {
            publish(ln, events);
            fail_plan(ln, plan, decode_error(rc, ""));
            return;
        }
    }
    for (int64_t id : plan.released_waiting) {
        if (!ln.sched.find(id)->preempted) {
            leave_queue();
        }
    }
    for (int64_t id : plan.released) {                 // cancelled: a last event, then forget
        engine_event ev;
        ev.id_request = id;
        ev.status = REQUEST_STATUS_FINISHED_ABORTED;
        ev.timings = obs_.finished(id, ev.status);
        events.push_back(std::move(ev));
        forget(ln, id);
    }
    uint64_t t1 = now_us();
    delta.t_schedule_us = t1 - t0;

    if (plan.empty()) {
        publish(ln, events);
        return;
    }
    std::vector<int32_t> logit_index, prompt_rows_at;
    decode_plan(ln, plan, logit_index, prompt_rows_at);
    const uint32_t gather = tp_->active() ? gather_for(ln, plan) : 0;
    uint64_t t2 = now_us();
    delta.t_batch_us = t2 - t1;
    int32_t rc = -1;
    std::string failure;
    const int32_t reused_before = llama_perf_context(ln.ctx).n_reused;
    try {
        rc = decode(ln, gather);
    } catch (const std::exception & e) {
        failure = e.what();
    }
    uint64_t t3 = now_us();
    delta.t_decode_us = t3 - t2;
    delta.n_graphs_reused = (uint64_t) std::max(0, llama_perf_context(ln.ctx).n_reused - reused_before);
    if (rc != 0) {
        publish(ln, events);
        fail_plan(ln, plan, decode_error(rc, failure));
        return;
    }
    save_prefixes(ln, plan);

    for (size_t i = 0; i < plan.items.size(); ++i) {   // before the first sample takes them
        if (prompt_rows_at[i] >= 0) {
            const plan_item & item = plan.items[i];
            take_prompt_rows(ln, ln.live.at(item.id_request), ln.sched.find(item.id_request)->prompt,
                             item.pos0, item.n_tokens, prompt_rows_at[i]);
        }
    }
    std::vector<step_outcome> outcomes;
    std::vector<int64_t> sample_us(plan.items.size(), 0);
    uint64_t t_item = t3;
    for (size_t i = 0; i < plan.items.size(); ++i) {
        const plan_item & item = plan.items[i];
        if (!item.want_logits) {
            continue;
        }
        engine_event ev;
        outcomes.push_back(item.n_draft > 0 ? sample_drafted(ln, item, logit_index[i], ev)
                                            : sample_guarded(ln, item.id_request, logit_index[i], ev));
        delta.n_draft_tokens += item.n_draft;
        delta.n_draft_accepted_tokens += outcomes.back().n_accepted;
        events.push_back(std::move(ev));
        const uint64_t t_sampled = now_us();
        sample_us[i] = (int64_t) (t_sampled - t_item);
        t_item = t_sampled;
    }
    uint64_t t4 = t_item;
    delta.t_sample_us = t4 - t3;
    ln.sched.charge(plan, (int64_t) delta.t_decode_us, sample_us);

    const std::vector<int64_t> finished = ln.sched.apply(plan, outcomes);
    finish_events(ln, finished, events);
    publish(ln, events);
    uint64_t t5 = now_us();
    delta.t_emit_us = t5 - t4;
    delta.n_steps = 1;
    delta.n_tokens_decoded = plan.n_tokens;
    delta.n_tokens_sampled = outcomes.size() + delta.n_draft_accepted_tokens;
    obs_.step(plan, t0, delta);
    std::lock_guard<std::mutex> lock(mu_stats_);
    stats_ += delta;
}

void engine::decode_plan(lane & ln, const batch_plan & plan, std::vector<int32_t> & logit_index,
                         std::vector<int32_t> & prompt_rows_at) {
    llama_batch & batch = ln.batch;
    batch.n_tokens = 0;
    logit_index.assign(plan.items.size(), -1);
    prompt_rows_at.assign(plan.items.size(), -1);
    for (size_t i = 0; i < plan.items.size(); ++i) {
        const plan_item & item = plan.items[i];
        const sched_request * req = ln.sched.find(item.id_request);
        // a drafted item samples at every position: its rows start at its first token
        const int32_t first_sampled = item.n_draft > 0 ? batch.n_tokens : batch.n_tokens + item.n_tokens - 1;
        // a prompt chunk whose log-probabilities were asked for: a row at every token, in the
        // prefill the request does anyway
        const bool every_row = item.is_prompt && ln.live.at(item.id_request).wants_prompt_rows();
        if (every_row) {
            prompt_rows_at[i] = batch.n_tokens;
        }
        for (int32_t k = 0; k < item.n_tokens; ++k) {
            const int32_t token = item.is_prompt ? req->prompt[item.pos0 + k]
                                : k == 0         ? req->last_token
                                                 : req->draft[k - 1];
            const bool last = k == item.n_tokens - 1;
            batch_add(batch, token, item.pos0 + k, item.id_slot,
                      every_row || (item.want_logits && (last || item.n_draft > 0)));
        }
        if (item.want_logits) {
            logit_index[i] = first_sampled;
        }
    }
}

// A request that wants its prompt's log-probabilities was admitted into a slot whose cache
// holds part of its prompt: those tokens are decoded again (their KV replaced), in batches of
// the context's size, since their logits were never kept. vLLM skips the prefix cache for such
// a request the same way. What a preempted request found already is not computed twice.
// Returns llama_decode's code (0: done).
int32_t engine::recompute_prefix(lane & ln, const plan_admission & adm) {
    live_request & live = ln.live.at(adm.id_request);
    if (!live.wants_prompt_rows()) {
        return 0;
    }
    const int32_t from = (int32_t) live.prompt_rows.size();   // the next position whose row is missing
    if (from >= adm.n_keep) {
        return 0;
    }
    sched_request * req = ln.sched.find(adm.id_request);
    if (!req->preempted) {
        req->n_cached = from;              // decoded again: not read from the cache
    }
    tp_->seq_rm(ln.ctx, adm.id_slot, from, -1);
    const int32_t n_batch = (int32_t) llama_n_batch(ln.ctx);
    for (int32_t pos = from; pos < adm.n_keep;) {
        const int32_t n = std::min(n_batch, adm.n_keep - pos);
        ln.batch.n_tokens = 0;
        for (int32_t k = 0; k < n; ++k) {
            batch_add(ln.batch, req->prompt[pos + k], pos + k, adm.id_slot, true);
        }
        const int32_t rc = decode(ln);
        if (rc != 0) {
            return rc;
        }
        take_prompt_rows(ln, live, req->prompt, pos, n, 0);
        pos += n;
    }
    return 0;
}

// Prompt token k + 1's log-probability comes from the logits at position k; the chunk at
// [pos0, pos0 + n_tokens) has its rows from batch row `first` on. The last prompt token's row
// is the first sample's.
// The rows go over the lane's threads (idle between two decodes): a row is a few passes over
// the vocabulary, and a chunk has up to a batch of them.
void engine::take_prompt_rows(lane & ln, live_request & live, const std::vector<int32_t> & prompt,
                              int32_t pos0, int32_t n_tokens, int32_t first) {
    const int32_t n_top = live.request->sampling.n_top_logprobs;
    const int32_t n_have = (int32_t) live.prompt_rows.size();
    // positions pos0 + k from k_from on are new (rows before were found earlier); the last
    // prompt token's row is the first sample's
    const int32_t k_from = std::max(0, n_have - pos0);
    const int32_t k_to = std::min(n_tokens, (int32_t) prompt.size() - 1 - pos0);
    if (pos0 > n_have || k_from >= k_to) {
        return;
    }
    std::vector<const float *> logits(k_to - k_from);
    for (int32_t k = k_from; k < k_to; ++k) {
        logits[k - k_from] = llama_get_logits_ith(ln.ctx, first + k);   // not thread-safe: here
    }
    std::vector<logprob_entry> & out = live.prompt_rows;
    out.resize(n_have + (k_to - k_from));
    auto work = [&](int32_t from, int32_t to) {
        for (int32_t k = from; k < to; ++k) {
            out[n_have + k - k_from] = logprob_entry_of(logits[k - k_from], prompt[pos0 + k + 1], n_top);
        }
    };
    const int32_t n_rows = k_to - k_from;
    const int32_t n_threads = std::max(1, std::min(n_threads_full_, n_rows / 16));
    std::vector<std::thread> helpers;
    const int32_t per = (n_rows + n_threads - 1) / n_threads;
    for (int32_t t = 1; t < n_threads; ++t) {
        helpers.emplace_back(work, k_from + t * per, std::min(k_to, k_from + (t + 1) * per));
    }
    work(k_from, std::min(k_to, k_from + per));
    for (std::thread & helper : helpers) {
        helper.join();
    }
}

logprob_entry engine::logprob_entry_of(const float * logits, int32_t token, int32_t n_top) const {
    const logit_stats stats = logit_stats_of(logits, llama_vocab_n_tokens(vocab_), n_top);
    logprob_entry entry{{token, logits[token] - stats.log_sum_exp, token_piece(vocab_, token)}, {}};
    entry.top.reserve(stats.top.size());
    for (const auto & [t, logit] : stats.top) {
        entry.top.push_back({t, logit - stats.log_sum_exp, token_piece(vocab_, t)});
    }
    return entry;
}

// One request's failure in sampling (a grammar that throws, a bad state in llama.cpp) ends
// that request with an error event; the others in the batch go on.
step_outcome engine::sample_guarded(lane & ln, int64_t id_request, int32_t index, engine_event & ev,
                                    int32_t n_before) {
    try {
        return sample(ln, id_request, index, ev, n_before);
    } catch (const std::exception & e) {
        ev.error = std::string("sampling failed: ") + e.what();
    } catch (...) {
        ev.error = "sampling failed";
    }
    ev.id_request = id_request;
    ev.text.clear();
    ev.logprobs.clear();
    return {id_request, -1, REQUEST_STATUS_FINISHED_ERROR};
}

// Verifies a draft: samples position after position, each exactly as without the draft (the
// same sampler, RNG draws, grammar, penalties, stop strings and limits, in the same order),
// while the sample is the drafted token. For greedy that is "accept while the argmax is the
// draft". For temperature > 0 it is the speculative-sampling rule with a point-mass draft: the
// draft x is kept with probability p(x), and otherwise the token drawn is distributed as p with
// x removed and renormalised, so every token is distributed as without drafting. The KV cells
// of the drafted tokens after the last accepted one are removed; the samples go out as one event.
step_outcome engine::sample_drafted(lane & ln, const plan_item & item, int32_t index, engine_event & ev) {
    const std::vector<token_t> & draft = ln.sched.find(item.id_request)->draft;
    step_outcome out{};
    for (int32_t j = 0; j <= item.n_draft; ++j) {
        engine_event one;
        out = sample_guarded(ln, item.id_request, index + j, one, j);
        out.n_accepted = j;
        if (j == 0) {
            ev = std::move(one);
        } else {
            ev.text += one.text;
            ev.n_tokens += one.n_tokens;
            ev.n_generated = one.n_generated;
            ev.error = one.error;
            for (auto & entry : one.logprobs) {
                ev.logprobs.push_back(std::move(entry));
            }
        }
        if (request_status_is_finished(out.status) || j == item.n_draft || out.token != draft[j]) {
            break;
        }
    }
    if (out.n_accepted < item.n_draft) {
        tp_->seq_rm(ln.ctx, item.id_slot, item.pos0 + 1 + out.n_accepted, -1);
    }
    obs_.drafted(item.id_request, item.n_draft, out.n_accepted);
    return out;
}

// Sample the next token of one request from output row `index`, and describe it in `ev`;
// `n_before` tokens of the request were sampled earlier in this step (a draft's verification).
step_outcome engine::sample(lane & ln, int64_t id_request, int32_t index, engine_event & ev, int32_t n_before) {
    live_request & live = ln.live.at(id_request);
    const sched_request & req = *ln.sched.find(id_request);
    const sampling_params & sp = live.request->sampling;
    const float * logits = llama_get_logits_ith(ln.ctx, index);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab_);

    logit_stats stats{};
    if (sp.logprobs) {
        stats = logit_stats_of(logits, n_vocab, sp.n_top_logprobs);
    }
    const int32_t n_generated = req.n_generated + n_before;
    const bool suppress_eog = sp.ignore_eos || n_generated < sp.min_tokens;
    const int32_t token = live.sampler->sample(logits, n_vocab, suppress_eog, eog_tokens_);
    obs_.token(id_request);

    ev.id_request = id_request;
    ev.n_tokens = 1;
    ev.n_prompt = live.n_prompt;
    if (live.wants_prompt_rows()) {        // the prompt's rows go out with the first sample
        ev.prompt_logprobs = std::move(live.prompt_rows);
        live.prompt_rows.clear();
        live.prompt_rows_sent = true;
    }
    ev.n_cached = req.n_cached;
    ev.n_generated = n_generated + 1;
    if (token == LLAMA_TOKEN_NULL) {
        ev.n_tokens = 0;
        ev.n_generated = n_generated;
        ev.error = "the response format's grammar allows no further token";
        return {id_request, -1, REQUEST_STATUS_FINISHED_ERROR};
    }
    live.sampler->accept(token);
    request_status status = REQUEST_STATUS_RUNNING;
    const std::string piece = token_piece(vocab_, token);   // an end token's is empty: not text
    if (llama_vocab_is_eog(vocab_, token)) {
        status = REQUEST_STATUS_FINISHED_STOPPED;
    } else {
        ev.text = live.stream.push(piece);
        if (live.stream.stopped()) {
            status = REQUEST_STATUS_FINISHED_STOPPED;
        }
    }
    // The end token has its log-probability too (as vLLM and OpenAI list it): a harness that
    // scores a prompt by echo with one generated token counts on that last entry being there.
    if (sp.logprobs) {
        logprob_entry entry{{token, logits[token] - stats.log_sum_exp, piece}, {}};
        for (const auto & [t, logit] : stats.top) {
            entry.top.push_back({t, logit - stats.log_sum_exp, token_piece(vocab_, t)});
        }
        ev.logprobs.push_back(std::move(entry));
    }
    return {id_request, token, status};
}

// The last event of each finished request carries its status and any text held back.
void engine::finish_events(lane & ln, const std::vector<int64_t> & finished, std::vector<engine_event> & events) {
    for (int64_t id : finished) {
        const sched_request * req = ln.sched.find(id);
        live_request & live = ln.live.at(id);
        for (auto it = events.rbegin(); it != events.rend(); ++it) {
            if (it->id_request == id) {
                it->status = req->status;
                it->timings = obs_.finished(id, req->status);
                it->text += live.stream.flush();
                it->stop = live.stream.matched();
                break;
            }
        }
        forget(ln, id);
    }
}

// The decode of a plan failed. Its requests end with an error and their sequences are cleared,
// in the KV cache and in the scheduler's view alike, so prefix reuse never trusts cells that
// no longer hold what it thinks. llama.cpp leaves the sequences outside the batch untouched.
void engine::fail_plan(lane & ln, const batch_plan & plan, const std::string & error) {
    std::vector<engine_event> events;
    for (const plan_item & item : plan.items) {
        if (ln.live.count(item.id_request) == 0) {
            continue;                  // several items of one request: handled at the first
        }
        events.push_back(failed_event(item.id_request, error));
        tp_->seq_rm(ln.ctx, item.id_slot, -1, -1);
        ln.sched.fail(item.id_request);
        forget(ln, item.id_request);
    }
    publish(ln, events);
}
