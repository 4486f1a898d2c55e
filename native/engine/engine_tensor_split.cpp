// The engine's side of a tensor split (lockstep.h): the leader's gather for a step (how many
// candidates each follower sends back per row) and its group's loss, and a follower's loop.
#include "engine.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

// Every output row of the step is sampled (sample(), sample_drafted(): a draft's rows each as
// without the draft) or read for log-probabilities (those requests need whole rows), so the
// step's rows can come as candidates when every request with a row allows it.
uint32_t engine::gather_for(const lane & ln, const batch_plan & plan) const {
    if (tp_full_rows_) {
        return 0;
    }
    int32_t most = 0;
    for (const plan_item & item : plan.items) {
        const live_request & live = ln.live.at(item.id_request);
        const bool rows = item.want_logits || (item.is_prompt && live.wants_prompt_rows());
        if (!rows) {
            continue;
        }
        if (live.candidates < 0 || live.candidates > (int32_t) lockstep_wire::kMaxGather) {
            return 0;
        }
        most = std::max(most, live.candidates);
    }
    return (uint32_t) most;
}

std::string engine::tensor_lost() const {
    return tp_ && tp_->lost() ? "the tensor-parallel group was lost (a node holding part of the model is gone): " +
                                    tp_->lost_reason()
                              : "";
}

std::string engine::follow() {
    if (params_.tp_rank <= 0) {
        throw std::logic_error("only a tensor-parallel follower (tp_rank > 0) follows");
    }
    std::lock_guard<std::mutex> following(mu_follow_);
    {
        std::lock_guard<std::mutex> lock(mu_tasks_);
        if (stop_) {
            return "closed";
        }
    }
    lane & ln = *lanes_.front();
    const control_limits limits{(int32_t) llama_n_batch(ln.ctx), (int32_t) llama_n_seq_max(ln.ctx), n_vocab(),
                                params_.context_length};
    return tp_->follow(ln.ctx, ln.batch, limits, follow_stop_, [this](int32_t n_tokens, uint64_t us) {
        std::lock_guard<std::mutex> lock(mu_stats_);
        stats_.n_steps += 1;
        stats_.n_tokens_decoded += n_tokens;
        stats_.t_decode_us += us;
    });
}
