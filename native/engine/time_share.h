// The engine's time, shared equally between the owners (API keys) whose requests are running.
//
// Slots are shared by key_share at admission, but a slot is not a fixed cost: one key's three
// sequences make every step of everyone's batch longer, and a grammar-constrained sequence can
// spend milliseconds of the engine thread on its sample. Each step's time is charged to the
// owners whose items were in it (the decode by tokens, each sample to its own request), as a
// virtual clock per owner (the idea of Linux's CFS, with owners in the place of tasks). While
// two or more owners run, the owner furthest behind runs all its items (among equals the one
// spending least in the step, so a tie never hands a step to the heavier one), and every other
// owner takes part only up to what that owner spends in the step, plus an eighth of it (equal
// loads a few microseconds apart all run), plus what it is behind: its sequences that do not
// fit sit out this step (they keep their slot and their KV), the least recently stepped first
// in line next time. A cheap stream beside an expensive key then keeps a
// token every step, and the expensive key gets the engine time the cheap one leaves unused.
// With one owner running nothing changes.
//
// All times are integer microseconds, so the Python twin (tests/engine/oracle/time_share.py) makes
// the same decisions.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

struct share_candidate {
    int64_t  id_owner;
    uint64_t n_step_last;    // the step this request last took part in (rotation inside an owner)
    int64_t  cost_us;        // what one step of it cost lately; 0 when not known yet
};

class time_share {
public:
    // An owner that comes back keeps at most this much of a lead (its old debt); older usage is
    // forgiven.
    static constexpr int64_t MAX_LEAD_US = 1000000;

    // Which candidates (running requests, in admission order) take part in this step.
    std::vector<bool> select(const std::vector<share_candidate> & candidates);
    // One item of the step just run cost `us`. Returns the request's new cost estimate from
    // `cost_us` (only one-token decode items update estimates: a prompt chunk is no guide to the
    // next step).
    int64_t charge(int64_t id_owner, int64_t us, bool decode_item, int64_t cost_us);

private:
    struct owner_usage {
        int64_t used_us = 0;     // the owner's virtual clock
        int64_t cost_us = 0;     // a typical decode item of this owner lately
    };
    int64_t estimate(const share_candidate & c) const;
    void    enter(const std::vector<int64_t> & active);

    std::unordered_map<int64_t, owner_usage> owners_;
    int64_t min_used_us_ = 0;    // never goes back: the furthest-behind running owner's clock
    int64_t cost_us_ = 0;        // a typical decode item of anyone lately
};
