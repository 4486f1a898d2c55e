// The engine's embed step (engine.h): an embedding model's turn of lane 0's loop, and the
// cancelling of a queued embedding job.
#include "engine.h"
#include "engine_steps.h"

#include <cmath>
#include <mutex>
#include <vector>

// An embedding job is dropped between batches: an abandoned request stops costing anything.
void engine::cancel_embedding(int64_t id_request, std::vector<engine_event> & events) {
    for (auto it = embed_jobs_.begin(); it != embed_jobs_.end(); ++it) {
        if (it->id_request == id_request) {
            leave_queue_and_engine(it->id_owner);
            engine_event ev;
            ev.id_request = id_request;
            ev.status = REQUEST_STATUS_FINISHED_ABORTED;
            ev.timings = obs_.finished(id_request, ev.status);
            events.push_back(std::move(ev));
            embed_jobs_.erase(it);
            return;
        }
    }
}

// ---- embeddings ----------------------------------------------------------------------------

// Whole inputs go into one batch: first one input of every job, oldest first, so a small
// request is never stuck behind a large one; then as many more as fit, oldest job first.
void engine::step_embed(lane & ln) {
    if (embed_jobs_.empty()) {
        return;
    }
    const int32_t n_embd = llama_model_n_embd(model_);
    const int32_t n_cap = (int32_t) llama_n_batch(ln.ctx);
    const int32_t n_seq_cap = (int32_t) llama_n_seq_max(ln.ctx);

    struct placed { size_t job, input; int32_t seq; };
    std::vector<placed> placed_inputs;
    std::vector<size_t> next(embed_jobs_.size());
    ln.batch.n_tokens = 0;
    auto place = [&](size_t j) {
        const embed_job & job = embed_jobs_[j];
        if (next[j] >= job.inputs.size()) {
            return false;
        }
        const auto & tokens = job.inputs[next[j]];
        const int32_t seq = (int32_t) placed_inputs.size();
        if (ln.batch.n_tokens + (int32_t) tokens.size() > n_cap || seq >= n_seq_cap) {
            return false;
        }
        for (size_t k = 0; k < tokens.size(); ++k) {
            batch_add(ln.batch, tokens[k], (int32_t) k, seq, true);
        }
        placed_inputs.push_back({j, next[j], seq});
        next[j] += 1;
        return true;
    };
    for (size_t j = 0; j < embed_jobs_.size(); ++j) {
        next[j] = embed_jobs_[j].n_done;
        place(j);
    }
    for (size_t j = 0; j < embed_jobs_.size(); ++j) {
        while (place(j)) {
        }
    }

    std::vector<engine_event> events;
    if (placed_inputs.empty()) {                // an input longer than a batch: refuse its job
        events.push_back(failed_event(embed_jobs_.front().id_request,
                                      "input is longer than the model's context"));
        leave_queue_and_engine(embed_jobs_.front().id_owner);
        embed_jobs_.erase(embed_jobs_.begin());
        publish(ln, events);
        return;
    }
    tp_->clear(ln.ctx);
    const uint64_t t0 = now_us();
    const int32_t rc = decode(ln);
    const uint64_t t1 = now_us();
    for (const placed & p : placed_inputs) {
        embed_job & job = embed_jobs_[p.job];
        if (job.out.empty()) {
            job.out.assign(job.inputs.size() * n_embd, 0.0f);
        }
        const float * v = rc == 0 ? llama_get_embeddings_seq(ln.ctx, p.seq) : nullptr;
        if (v != nullptr) {
            double norm = 0.0;
            for (int32_t d = 0; d < n_embd; ++d) {
                norm += (double) v[d] * v[d];
            }
            const float scale = norm > 0.0 ? (float) (1.0 / std::sqrt(norm)) : 0.0f;
            for (int32_t d = 0; d < n_embd; ++d) {
                job.out[p.input * n_embd + d] = v[d] * scale;
            }
        }
        job.n_tokens += (int32_t) job.inputs[p.input].size();
    }
    std::vector<bool> finishing(embed_jobs_.size());
    for (size_t j = 0; j < embed_jobs_.size(); ++j) {
        embed_job & job = embed_jobs_[j];
        // A failed decode ends the jobs that were in it; the others wait for the next batch.
        finishing[j] = rc == 0 ? next[j] == job.inputs.size() : next[j] > job.n_done;
        job.n_done = next[j];
    }
    size_t j = 0;
    for (auto it = embed_jobs_.begin(); it != embed_jobs_.end(); ++j) {
        if (!finishing[j]) {
            ++it;
            continue;
        }
        engine_event ev;
        ev.id_request = it->id_request;
        ev.n_prompt = it->n_tokens;
        if (rc != 0) {
            ev.status = REQUEST_STATUS_FINISHED_ERROR;
            ev.error = "llama_decode failed";
        } else {
            ev.status = REQUEST_STATUS_FINISHED_STOPPED;
            ev.embedding = std::move(it->out);
        }
        ev.timings = obs_.finished(ev.id_request, ev.status);
        events.push_back(std::move(ev));
        leave_queue_and_engine(it->id_owner);
        it = embed_jobs_.erase(it);
    }
    publish(ln, events);
    std::lock_guard<std::mutex> lock(mu_stats_);
    stats_.n_steps += 1;
    stats_.n_tokens_decoded += ln.batch.n_tokens;
    stats_.t_decode_us += t1 - t0;
}
