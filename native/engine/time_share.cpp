#include "time_share.h"

#include <algorithm>
#include <climits>

namespace {

// A running average that follows the last few steps; integer, as in the twin.
int64_t blend(int64_t average, int64_t us) {
    return average == 0 ? us : (3 * average + us) / 4;
}

constexpr int64_t k_slack_divisor = 8;

bool contains(const std::vector<int64_t> & owners, int64_t owner) {
    return std::find(owners.begin(), owners.end(), owner) != owners.end();
}

}  // namespace

int64_t time_share::estimate(const share_candidate & c) const {
    if (c.cost_us > 0) {
        return c.cost_us;
    }
    auto it = owners_.find(c.id_owner);
    return it != owners_.end() && it->second.cost_us > 0 ? it->second.cost_us : cost_us_;
}

// The owners running now: a newcomer starts at the clock of the owner furthest behind (no
// credit for having been away), one back from a pause keeps at most MAX_LEAD_US of its debt.
// Owners that run nothing and owe nothing are forgotten, so the map stays small.
void time_share::enter(const std::vector<int64_t> & active) {
    int64_t floor = INT64_MAX;
    for (int64_t owner : active) {
        auto [it, fresh] = owners_.try_emplace(owner);
        owner_usage & usage = it->second;
        if (fresh) {
            usage.used_us = min_used_us_;
        }
        usage.used_us = std::clamp(usage.used_us, min_used_us_, min_used_us_ + MAX_LEAD_US);
        floor = std::min(floor, usage.used_us);
    }
    if (!active.empty()) {
        min_used_us_ = std::max(min_used_us_, floor);
    }
    for (auto it = owners_.begin(); it != owners_.end();) {
        if (it->second.used_us <= min_used_us_ && !contains(active, it->first)) {
            it = owners_.erase(it);
        } else {
            ++it;
        }
    }
}

std::vector<bool> time_share::select(const std::vector<share_candidate> & candidates) {
    std::vector<int64_t> active;                      // distinct owners, in admission order
    for (const share_candidate & c : candidates) {
        if (!contains(active, c.id_owner)) {
            active.push_back(c.id_owner);
        }
    }
    enter(active);
    std::vector<bool> take(candidates.size(), true);
    if (active.size() < 2) {
        return take;
    }
    std::unordered_map<int64_t, int64_t> spend;       // what each owner would spend in this step
    for (const share_candidate & c : candidates) {
        spend[c.id_owner] += estimate(c);
    }
    // The owner furthest behind; among equals the one that spends least, so that a tie never
    // lets the heavier owner run everything beside the light one; then the earliest admitted.
    int64_t behind = active[0];
    for (int64_t owner : active) {
        const int64_t used = owners_[owner].used_us, used_behind = owners_[behind].used_us;
        if (used < used_behind || (used == used_behind && spend[owner] < spend[behind])) {
            behind = owner;
        }
    }
    const int64_t floor = owners_[behind].used_us;
    const int64_t slice = spend[behind];
    for (int64_t owner : active) {
        if (owner == behind) {
            continue;
        }
        std::vector<size_t> mine;
        for (size_t i = 0; i < candidates.size(); ++i) {
            if (candidates[i].id_owner == owner) {
                mine.push_back(i);
            }
        }
        std::stable_sort(mine.begin(), mine.end(), [&](size_t a, size_t b) {
            return candidates[a].n_step_last < candidates[b].n_step_last;
        });
        // An eighth of the step in hand: two owners with equal loads stay a few microseconds
        // apart (sampling times differ), and should still run all their sequences every step.
        const int64_t allowance = floor + slice + slice / k_slack_divisor - owners_[owner].used_us;
        int64_t spent = 0;
        for (size_t i : mine) {
            const int64_t cost = estimate(candidates[i]);
            if (spent + cost > allowance) {
                take[i] = false;                      // sits out: first in line next time
            } else {
                spent += cost;
            }
        }
    }
    return take;
}

int64_t time_share::charge(int64_t id_owner, int64_t us, bool decode_item, int64_t cost_us) {
    owner_usage & usage = owners_[id_owner];
    usage.used_us += us;
    if (!decode_item) {
        return cost_us;
    }
    usage.cost_us = blend(usage.cost_us, us);
    cost_us_ = blend(cost_us_, us);
    return blend(cost_us, us);
}
