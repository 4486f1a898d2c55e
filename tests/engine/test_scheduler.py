"""The continuous-batching policy with a fake decoder: no model, hand-built outcomes.
Every test runs twice: against the native scheduler and against its Python twin."""
import pytest

from stackd.engine.core import STATUS_ABORTED, STATUS_LENGTH, STATUS_RUNNING, STATUS_STOPPED
from stackd.engine.core import Scheduler as NativeScheduler
from .oracle.policy import Scheduler as PythonScheduler


@pytest.fixture(params=[NativeScheduler, PythonScheduler], ids=["native", "python"])
def Scheduler(request):
    """The implementation under test; each test takes it as its first argument."""
    return request.param

ITEM_ID, ITEM_SLOT, ITEM_POS, ITEM_N, ITEM_PROMPT, ITEM_LOGITS = range(6)


class FakeDecoder:
    """Runs plans: every item that wants logits 'samples' token 1000 + its position,
    or STOPPED once a request has produced `stop_after` tokens."""

    def __init__(self, sched, stop_after: dict | None = None):
        self.sched = sched
        self.stop_after = stop_after or {}
        self.produced: dict[int, list[int]] = {}
        self.finished: dict[int, int] = {}

    def step(self):
        plan = self.sched.schedule()
        outcomes = []
        for item in plan["items"]:
            if not item[ITEM_LOGITS]:
                continue
            rid = item[ITEM_ID]
            token = 1000 + item[ITEM_POS] + item[ITEM_N] - 1
            got = self.produced.setdefault(rid, [])
            got.append(token)
            status = STATUS_STOPPED if len(got) == self.stop_after.get(rid, -1) else STATUS_RUNNING
            outcomes.append((rid, token, status))
        for rid in self.sched.apply(outcomes):
            self.finished[rid] = self.sched.request(rid)["status"]
            self.sched.release(rid)
        for rid in plan["released"]:
            self.finished[rid] = STATUS_ABORTED
            self.sched.release(rid)
        return plan

    def run(self, max_steps=1000):
        plans = []
        for _ in range(max_steps):
            plan = self.step()
            if not plan["items"] and self.sched.n_waiting == 0 and self.sched.n_running == 0:
                break
            plans.append(plan)
        return plans


def test_admits_up_to_the_slot_count_and_queues_the_rest(Scheduler):
    sched = Scheduler(n_slots=2, n_batch=64, n_ctx_seq=128)
    for rid in range(3):
        assert sched.enqueue(rid, [1, 2, 3], 4)
    plan = sched.schedule()
    assert [a[0] for a in plan["admissions"]] == [0, 1]
    assert sched.n_waiting == 1 and sched.n_running == 2


def test_queue_bound_refuses_beyond_it(Scheduler):
    sched = Scheduler(n_slots=1, n_batch=64, n_ctx_seq=128, n_max_waiting=2)
    assert sched.enqueue(1, [1], 4) and sched.enqueue(2, [1], 4)
    assert not sched.enqueue(3, [1], 4)


def test_empty_prompt_is_refused(Scheduler):
    assert not Scheduler(n_slots=1, n_batch=8, n_ctx_seq=8).enqueue(1, [], 4)


def test_running_streams_get_a_token_every_step_while_a_long_prompt_is_chunked(Scheduler):
    sched = Scheduler(n_slots=4, n_batch=16, n_ctx_seq=1024)
    decoder = FakeDecoder(sched)
    sched.enqueue(1, [5, 6], 100)
    decoder.step()                                     # prefill of request 1, first token
    sched.enqueue(2, list(range(100)), 4)              # a long prompt arrives
    for _ in range(7):
        plan = decoder.step()
        assert any(i[ITEM_ID] == 1 and not i[ITEM_PROMPT] for i in plan["items"])
        assert plan["n_tokens"] <= 16
    chunks = [i for p in [sched.schedule()] for i in p["items"] if i[ITEM_ID] == 2]
    assert chunks                                      # still prefilling in bounded chunks


def test_prefill_chunks_cover_the_prompt_exactly_once(Scheduler):
    sched = Scheduler(n_slots=1, n_batch=10, n_ctx_seq=1024)
    decoder = FakeDecoder(sched)
    prompt = list(range(37))
    sched.enqueue(7, prompt, 3)
    plans = decoder.run()
    positions = [(i[ITEM_POS], i[ITEM_N]) for p in plans for i in p["items"] if i[ITEM_PROMPT]]
    covered = [pos for start, n in positions for pos in range(start, start + n)]
    assert covered == list(range(37))
    assert all(n <= 10 for _, n in positions)
    assert decoder.finished[7] == STATUS_LENGTH and len(decoder.produced[7]) == 3


def test_max_tokens_and_stop_finish_requests(Scheduler):
    sched = Scheduler(n_slots=2, n_batch=64, n_ctx_seq=128)
    decoder = FakeDecoder(sched, stop_after={2: 2})
    sched.enqueue(1, [1, 2], 5)
    sched.enqueue(2, [1, 2], 5)
    decoder.run()
    assert decoder.finished == {1: STATUS_LENGTH, 2: STATUS_STOPPED}
    assert len(decoder.produced[1]) == 5 and len(decoder.produced[2]) == 2


def test_context_end_finishes_with_length(Scheduler):
    sched = Scheduler(n_slots=1, n_batch=64, n_ctx_seq=10)
    decoder = FakeDecoder(sched)
    sched.enqueue(1, list(range(8)), 100)
    decoder.run()
    assert decoder.finished[1] == STATUS_LENGTH
    assert len(decoder.produced[1]) == 2               # 8 prompt + 2 generated = the context


def test_prefix_reuse_picks_the_slot_with_the_longest_common_prefix(Scheduler):
    sched = Scheduler(n_slots=2, n_batch=64, n_ctx_seq=256)
    decoder = FakeDecoder(sched)
    system = list(range(50))
    sched.enqueue(1, system + [900, 901], 2)
    sched.enqueue(2, [7, 7, 7], 2)
    decoder.run()
    sched.enqueue(3, system + [902], 2)
    plan = sched.schedule()
    [(rid, slot, n_keep)] = plan["admissions"]
    assert rid == 3 and n_keep == 50
    assert sched.slot_cache(slot)[:50] == system
    prompt_items = [i for i in plan["items"] if i[ITEM_PROMPT]]
    assert prompt_items[0][ITEM_POS] == 50 and prompt_items[0][ITEM_N] == 1


def test_a_prompt_sharing_only_a_template_head_leaves_a_long_cache_alone(Scheduler):
    """A slot holding a long conversation is not displaced by a prompt that shares only its
    first tokens (the chat template's) while an empty slot is free; once every free slot is
    such a one, the least recently used goes, keeping what it shares."""
    sched = Scheduler(n_slots=2, n_batch=64, n_ctx_seq=256)
    decoder = FakeDecoder(sched)
    head = [1, 2, 3]
    sched.enqueue(1, head + list(range(100, 160)), 1)
    decoder.run()
    long_slot = next(i for i in range(2) if sched.slot_cache(i))
    sched.enqueue(2, head + list(range(200, 220)), 1)
    [(_, slot, n_keep)] = sched.schedule()["admissions"]
    assert slot != long_slot and n_keep == 0        # the empty slot: the 63-token cache stays
    decoder.run()
    sched.enqueue(3, head + [5, 5], 1)               # shares 3 tokens with each
    [(_, slot, n_keep)] = sched.schedule()["admissions"]
    assert slot == long_slot and n_keep == 3         # the least recently used


def test_identical_prompt_still_decodes_its_last_token(Scheduler):
    sched = Scheduler(n_slots=1, n_batch=64, n_ctx_seq=256)
    decoder = FakeDecoder(sched)
    sched.enqueue(1, [1, 2, 3, 4], 1)
    decoder.run()
    sched.enqueue(2, [1, 2, 3, 4], 1)
    plan = sched.schedule()
    assert plan["admissions"][0][2] == 3               # n_keep stops one short of the prompt
    assert [(i[ITEM_POS], i[ITEM_N]) for i in plan["items"]] == [(3, 1)]


def test_cancel_while_running_frees_the_slot_within_one_step(Scheduler):
    sched = Scheduler(n_slots=1, n_batch=64, n_ctx_seq=256)
    decoder = FakeDecoder(sched)
    sched.enqueue(1, [1, 2], 1000)
    sched.enqueue(2, [3, 4], 2)
    decoder.step()
    decoder.step()
    assert sched.cancel(1)
    plan = decoder.step()
    assert 1 in plan["released"] and decoder.finished[1] == STATUS_ABORTED
    assert [a[0] for a in plan["admissions"]] == [2]   # the freed slot is reused in the same step


def test_cancel_while_waiting(Scheduler):
    sched = Scheduler(n_slots=1, n_batch=64, n_ctx_seq=256)
    decoder = FakeDecoder(sched)
    sched.enqueue(1, [1], 100)
    sched.enqueue(2, [2], 100)
    decoder.step()
    sched.cancel(2)
    plan = decoder.step()
    assert plan["released"] == [2] and sched.n_waiting == 0


def test_cancel_unknown_or_finished_is_false(Scheduler):
    sched = Scheduler(n_slots=1, n_batch=64, n_ctx_seq=256)
    assert not sched.cancel(42)


@pytest.mark.parametrize("n_slots", [1, 3, 8])
def test_every_request_finishes_and_slots_are_all_free(Scheduler, n_slots):
    sched = Scheduler(n_slots=n_slots, n_batch=32, n_ctx_seq=512)
    decoder = FakeDecoder(sched)
    for rid in range(20):
        sched.enqueue(rid, list(range(rid % 7 + 1)), rid % 5 + 1)
    decoder.run()
    assert sorted(decoder.finished) == list(range(20))
    assert all(len(decoder.produced[r]) == r % 5 + 1 for r in range(20))
    assert sched.n_running == 0 and sched.n_waiting == 0


# ---- fair share between owners (API keys) --------------------------------------------------

def admitted_owners(plans, owner_of) -> list[int]:
    return [owner_of[adm[0]] for plan in plans for adm in plan["admissions"]]


def test_an_owner_over_its_share_waits_while_another_owner_waits(Scheduler):
    sched = Scheduler(n_slots=4, n_batch=64, n_ctx_seq=128, n_max_slots_per_owner=2)
    owner_of = {}
    for rid in range(1, 7):                          # owner 1 queues six requests first
        assert sched.enqueue(rid, [1, 2, 3], 50, owner=1)
        owner_of[rid] = 1
    assert sched.enqueue(7, [4, 5, 6], 50, owner=2)  # then owner 2 one
    owner_of[7] = 2
    first = sched.schedule()
    # owner 1 gets its share (2 slots), owner 2 is admitted ahead of owner 1's third request,
    # and the last slot goes back to owner 1: nobody else waits, a slot must not stand idle
    assert [owner_of[a[0]] for a in first["admissions"]] == [1, 1, 2, 1]
    assert [a[0] for a in first["admissions"]] == [1, 2, 7, 3]


def test_without_a_share_admission_is_first_come_first_served(Scheduler):
    sched = Scheduler(n_slots=4, n_batch=64, n_ctx_seq=128)
    for rid in range(1, 7):
        sched.enqueue(rid, [1, 2, 3], 50, owner=1)
    sched.enqueue(7, [4, 5, 6], 50, owner=2)
    assert [a[0] for a in sched.schedule()["admissions"]] == [1, 2, 3, 4]


def test_a_freed_slot_goes_to_the_owner_under_its_share(Scheduler):
    sched = Scheduler(n_slots=2, n_batch=64, n_ctx_seq=128, n_max_slots_per_owner=1)
    owner_of = {1: 1, 2: 1, 3: 1, 4: 2}
    for rid in (1, 2, 3):
        sched.enqueue(rid, [1, 2], 50, owner=1)
    decoder = FakeDecoder(sched, stop_after={1: 1, 2: 5, 3: 1, 4: 5})
    plans = [decoder.step()]                         # owner 2 not there yet: both slots to owner 1
    sched.enqueue(4, [7, 8], 50, owner=2)
    plans += decoder.run()
    # request 1 ends first; its slot goes to owner 2, ahead of owner 1's earlier request 3
    assert admitted_owners(plans, owner_of) == [1, 1, 2, 1]


def test_owners_over_share_do_not_leave_slots_idle(Scheduler):
    sched = Scheduler(n_slots=6, n_batch=64, n_ctx_seq=128, n_max_slots_per_owner=1)
    for rid in range(1, 5):
        sched.enqueue(rid, [1, 2], 50, owner=rid % 2)   # two owners, both over share at once
    assert len(sched.schedule()["admissions"]) == 4


def test_an_owner_under_its_share_takes_a_slot_back_from_an_owner_over_it(Scheduler):
    sched = Scheduler(n_slots=4, n_batch=64, n_ctx_seq=128, n_max_slots_per_owner=2)
    decoder = FakeDecoder(sched)
    for rid in range(1, 5):                          # owner 1 alone: every slot, work-conserving
        sched.enqueue(rid, [1, 2, 3], 10, owner=1)
    for _ in range(3):
        decoder.step()
    assert sched.n_running == 4
    sched.enqueue(5, [4, 5], 3, owner=2)
    plan = decoder.step()
    # the latest of owner 1's equals gives its slot back and waits at the head of the queue
    assert plan["preempted"] == [4] and [a[0] for a in plan["admissions"]] == [5]
    assert sched.request(4)["status"] == 0 and sched.n_waiting == 1
    decoder.run()
    assert decoder.finished[5] == STATUS_STOPPED or decoder.finished[5] == STATUS_LENGTH
    # resumed by recomputation: the same tokens as if it had never stopped (the fake decoder's
    # token is its position), and max_tokens counts what it made before too
    assert decoder.produced[4] == decoder.produced[1] == [1002 + k for k in range(10)]
    assert decoder.finished[4] == STATUS_LENGTH


# Owners are API keys' hashes (generate.owner_of: Python's str hash, seeded anew in every
# process), so any int64 is an owner: about half of all keys hash below zero in a given run.
@pytest.mark.parametrize("flood, bystander", [(-3130799525059436644, 6921847410374702581),
                                              (-1, -2), (-(2 ** 63), 2 ** 63 - 1), (0, -7)])
def test_preemption_holds_for_any_owner_id(Scheduler, flood, bystander):
    sched = Scheduler(n_slots=4, n_batch=64, n_ctx_seq=128, n_max_slots_per_owner=2)
    decoder = FakeDecoder(sched)
    for rid in range(1, 9):                          # the flood: every slot and a queue behind
        sched.enqueue(rid, [1, 2, 3], 50, owner=flood)
    for _ in range(3):
        decoder.step()
    sched.enqueue(9, [4, 5], 3, owner=bystander)
    plan = decoder.step()
    assert len(plan["preempted"]) == 1 and [a[0] for a in plan["admissions"]] == [9]


def test_owners_at_or_under_their_share_are_never_preempted(Scheduler):
    sched = Scheduler(n_slots=2, n_batch=64, n_ctx_seq=128, n_max_slots_per_owner=1)
    decoder = FakeDecoder(sched)
    sched.enqueue(1, [1, 2], 50, owner=1)
    sched.enqueue(2, [3, 4], 50, owner=2)
    decoder.step()
    sched.enqueue(3, [5, 6], 50, owner=3)
    assert all(not decoder.step()["preempted"] for _ in range(5))
    assert sched.request(3)["status"] == 0           # waits for a slot to end


def test_preemption_leaves_the_preempting_owner_no_more_than_its_share(Scheduler):
    sched = Scheduler(n_slots=4, n_batch=64, n_ctx_seq=128, n_max_slots_per_owner=2)
    decoder = FakeDecoder(sched)
    for rid in range(1, 5):
        sched.enqueue(rid, [1, 2, 3], 50, owner=1)
    decoder.step()
    for rid in range(5, 9):                          # owner 2 asks for four: gets its two
        sched.enqueue(rid, [4, 5], 50, owner=2)
    plan = decoder.step()
    assert len(plan["preempted"]) == 2 and [a[0] for a in plan["admissions"]] == [5, 6]
    assert all(not decoder.step()["preempted"] for _ in range(5))   # no back and forth


def test_a_failed_request_forgets_its_slot_cache(Scheduler):
    sched = Scheduler(n_slots=1, n_batch=64, n_ctx_seq=128)
    decoder = FakeDecoder(sched, stop_after={1: 2})
    sched.enqueue(1, [5, 6, 7, 8], 10)
    decoder.run()
    assert sched.slot_cache(0)[:4] == [5, 6, 7, 8]
    sched.enqueue(2, [5, 6, 7, 8, 9], 10)
    decoder.step()                                   # admitted with the prefix reused
    sched.fail(2)
    assert sched.slot_cache(0) == [] and sched.n_running == 0
    sched.release(2)
    sched.enqueue(3, [5, 6, 7, 8, 9], 10)
    plan = sched.schedule()
    assert plan["admissions"] == [(3, 0, 0)]         # nothing reused from a cache that is gone


def test_prefix_reuse_ties_go_to_the_least_recently_used_slot_in_both_twins():
    """Differential: random workloads through both implementations, same plans."""
    import random
    rng = random.Random(7)
    for trial in range(30):
        cap = rng.choice([0, 1, 2])                  # one draw: both twins get the same
        native, twin = (S(n_slots=3, n_batch=16, n_ctx_seq=64, n_max_slots_per_owner=cap)
                        for S in (NativeScheduler, PythonScheduler))
        decoders = [FakeDecoder(s, stop_after={}) for s in (native, twin)]
        next_id = 1
        for step in range(40):
            if rng.random() < 0.5:
                prompt = [rng.choice([1, 2, 3]) for _ in range(rng.randint(1, 6))]
                max_tokens, owner = rng.randint(1, 4), rng.randint(0, 2)
                assert native.enqueue(next_id, prompt, max_tokens, owner=owner) == \
                    twin.enqueue(next_id, prompt, max_tokens, owner=owner)
                next_id += 1
            if rng.random() < 0.1 and next_id > 1:
                victim = rng.randint(1, next_id - 1)
                assert native.cancel(victim) == twin.cancel(victim)
            plans = [d.step() for d in decoders]
            assert plans[0] == plans[1], (trial, step)


def test_a_power_budget_caps_the_slots_admitted(Scheduler):
    sched = Scheduler(n_slots=4, n_batch=64, n_ctx_seq=128)
    sched.set_active_slots(2)
    for rid in range(1, 5):
        sched.enqueue(rid, [1, 2], 50)
    assert [a[0] for a in sched.schedule()["admissions"]] == [1, 2]
    sched.set_active_slots(0)                        # full power again: the rest come in
    assert [a[0] for a in sched.schedule()["admissions"]] == [3, 4]


# ---- the engine's time shared between owners (time_share.h) ---------------------------------

class ChargingDecoder(FakeDecoder):
    """A fake decoder with a cost model: a step's decode costs `per_token_us` a token, and each
    sample of a request costs what `sample_us` says for it (0 when absent)."""

    def __init__(self, sched, per_token_us=1000, sample_us=None, **kw):
        super().__init__(sched, **kw)
        self.per_token_us, self.sample_us = per_token_us, sample_us or {}
        self.charged: dict[int, int] = {}            # request -> microseconds charged

    def step(self):
        plan = super().step()
        decode_us = self.per_token_us * plan["n_tokens"]
        samples = [self.sample_us.get(item[ITEM_ID], 0) if item[ITEM_LOGITS] else 0 for item in plan["items"]]
        for item, sample in zip(plan["items"], samples):
            rid = item[ITEM_ID]
            share = decode_us * item[ITEM_N] // max(plan["n_tokens"], 1)
            self.charged[rid] = self.charged.get(rid, 0) + share + sample
        # what the engine does after sampling: here after the outcomes were applied, which the
        # scheduler allows (finished requests are released later and charged while they exist)
        return plan


def stepped(plans, rid) -> int:
    return sum(1 for plan in plans for item in plan["items"] if item[ITEM_ID] == rid and not item[ITEM_PROMPT])


def shared_scheduler(Scheduler, **kw):
    return Scheduler(n_slots=4, n_batch=64, n_ctx_seq=4096, share_time=True, **kw)


def run_charged(sched, decoder, steps):
    plans = []
    for _ in range(steps):
        plan = sched.schedule()
        decoder_plan_step(sched, decoder, plan)
        plans.append(plan)
    return plans


def decoder_plan_step(sched, decoder, plan):
    """One step of `plan` through the fake decoder, charged to the scheduler as the engine does:
    the decode shared by tokens, then each sample, before the outcomes are applied."""
    decode_us = decoder.per_token_us * plan["n_tokens"]
    samples = [decoder.sample_us.get(item[ITEM_ID], 0) if item[ITEM_LOGITS] else 0 for item in plan["items"]]
    sched.charge(decode_us, samples)
    outcomes = [(item[ITEM_ID], 1000, STATUS_RUNNING) for item in plan["items"] if item[ITEM_LOGITS]]
    for rid in sched.apply(outcomes):
        sched.release(rid)


def test_one_owner_alone_is_never_held_back(Scheduler):
    sched = shared_scheduler(Scheduler)
    for rid in range(1, 5):
        sched.enqueue(rid, [1, 2], 1000, owner=1)
    decoder = ChargingDecoder(sched, sample_us={1: 50_000})
    plans = run_charged(sched, decoder, 20)
    assert all(len(plan["items"]) == 4 for plan in plans)


def test_a_cheap_stream_steps_every_time_beside_an_owner_with_three(Scheduler):
    sched = shared_scheduler(Scheduler)
    for rid in (1, 2, 3):
        sched.enqueue(rid, [1, 2], 1000, owner=1)
    sched.enqueue(4, [3, 4], 1000, owner=2)
    decoder = ChargingDecoder(sched)
    plans = run_charged(sched, decoder, 60)[4:]      # past the prompts and the first estimates
    assert all(any(item[ITEM_ID] == 4 for item in plan["items"]) for plan in plans)
    # the owner of three gets about the same engine time, not three times as much
    owner1 = sum(stepped(plans, rid) for rid in (1, 2, 3))
    assert owner1 <= stepped(plans, 4) + 2
    assert owner1 >= stepped(plans, 4) - 2
    # and it rotates: none of its three is left behind
    assert min(stepped(plans, rid) for rid in (1, 2, 3)) >= owner1 // 3 - 1
    # a tie in engine time never lets the owner of three run all of them beside the one
    assert all(sum(1 for item in plan["items"] if item[ITEM_ID] in (1, 2, 3)) < 3 for plan in plans)


def test_an_expensive_sampler_sits_out_steps_and_pays_for_its_time(Scheduler):
    sched = shared_scheduler(Scheduler)
    sched.enqueue(1, [1, 2], 1000, owner=1)          # a grammar that costs 4 ms a sample
    sched.enqueue(2, [3, 4], 1000, owner=2)          # an ordinary stream
    decoder = ChargingDecoder(sched, per_token_us=1000, sample_us={1: 4000})
    plans = run_charged(sched, decoder, 200)[4:]
    assert all(any(item[ITEM_ID] == 2 for item in plan["items"]) for plan in plans)
    expensive = stepped(plans, 1)
    assert 0 < expensive < len(plans)                # it sits out some steps, not all
    # engine time: owner 1's steps cost 1 + 4 ms, owner 2's 1 ms shared or 1 ms alone
    time1, time2 = expensive * 5000, stepped(plans, 2) * 1000
    assert abs(time1 - time2) <= 10_000


def test_a_newcomer_gets_no_credit_for_having_been_away(Scheduler):
    sched = shared_scheduler(Scheduler)
    for rid in (1, 2):
        sched.enqueue(rid, [1, 2], 1000, owner=1)
    decoder = ChargingDecoder(sched)
    run_charged(sched, decoder, 50)                  # owner 1 alone for a while
    sched.enqueue(3, [3, 4], 1000, owner=2)
    sched.enqueue(4, [3, 5], 1000, owner=2)
    plans = run_charged(sched, decoder, 12)[2:]
    # equal owners with equal loads: both step every time, nobody pays off the past
    assert all(len(plan["items"]) == 4 for plan in plans)


def test_without_share_time_every_running_request_steps(Scheduler):
    sched = Scheduler(n_slots=4, n_batch=64, n_ctx_seq=4096)
    for rid in (1, 2, 3):
        sched.enqueue(rid, [1, 2], 1000, owner=1)
    sched.enqueue(4, [3, 4], 1000, owner=2)
    decoder = ChargingDecoder(sched, sample_us={1: 9000})
    plans = run_charged(sched, decoder, 20)
    assert all(len(plan["items"]) == 4 for plan in plans)


def test_time_share_decisions_are_the_same_in_both_twins():
    """Differential: random owners, prompts and costs through both implementations."""
    import random
    rng = random.Random(11)
    for trial in range(30):
        cap = rng.choice([0, 2])
        native, twin = (S(n_slots=4, n_batch=16, n_ctx_seq=256, share_time=True, n_max_slots_per_owner=cap)
                        for S in (NativeScheduler, PythonScheduler))
        costs = {}
        next_id = 1
        for step in range(80):
            if rng.random() < 0.3:
                prompt = [rng.choice([1, 2, 3]) for _ in range(rng.randint(1, 20))]
                max_tokens, owner = rng.randint(1, 30), rng.randint(0, 3)
                costs[next_id] = rng.choice([0, 100, 3000])
                assert native.enqueue(next_id, prompt, max_tokens, owner=owner) == \
                    twin.enqueue(next_id, prompt, max_tokens, owner=owner)
                next_id += 1
            plans = [s.schedule() for s in (native, twin)]
            assert plans[0] == plans[1], (trial, step)
            decode_us = rng.randint(500, 20_000)
            samples = [costs[item[ITEM_ID]] if item[ITEM_LOGITS] else 0 for item in plans[0]["items"]]
            outcomes = [(item[ITEM_ID], 1000, STATUS_STOPPED if rng.random() < 0.05 else STATUS_RUNNING)
                        for item in plans[0]["items"] if item[ITEM_LOGITS]]
            for s in (native, twin):
                s.charge(decode_us, samples)
                for rid in s.apply(outcomes):
                    s.release(rid)
                for rid in plans[0]["released"]:
                    s.release(rid)


def test_owners_with_equal_loads_run_every_sequence_every_step(Scheduler):
    """Two keys with eight streams each, their samples a few microseconds apart: nobody sits
    out (batching is not lost to noise)."""
    sched = Scheduler(n_slots=16, n_batch=64, n_ctx_seq=4096, share_time=True)
    for rid in range(1, 17):
        sched.enqueue(rid, [rid % 3 + 1, 2], 1000, owner=1 + (rid - 1) // 8)
    jitter = {rid: (rid * 7) % 13 for rid in range(1, 17)}      # 0-12 us on top of each sample
    decoder = ChargingDecoder(sched, per_token_us=2000, sample_us={rid: 300 + j for rid, j in jitter.items()})
    plans = run_charged(sched, decoder, 40)[3:]
    assert all(len(plan["items"]) == 16 for plan in plans)


def test_a_steps_items_come_in_slot_order_whatever_the_admission_order(Scheduler):
    """llama.cpp puts in one ubatch only sequences whose ids rise by one from item to item: a
    step's items go by slot, so running slots side by side decode in one pass."""
    sched = Scheduler(n_slots=3, n_batch=64, n_ctx_seq=128)
    decoder = FakeDecoder(sched, stop_after={1: 1, 2: 1, 3: 1})
    for rid, prompt in ((1, [1, 1]), (2, [2, 2]), (3, [3, 3])):   # one cache per slot
        sched.enqueue(rid, prompt, 4)
    decoder.run()
    slot_of = {}
    for rid, prompt in ((4, [3, 3, 9]), (5, [1, 1, 9]), (6, [2, 2, 9])):   # admitted 2, 0, 1
        sched.enqueue(rid, prompt, 8)
    plans = [decoder.step() for _ in range(3)]
    for plan in plans:
        for item in plan["items"]:
            slot_of[item[ITEM_ID]] = item[ITEM_SLOT]
    assert [slot_of[rid] for rid in (4, 5, 6)] == [2, 0, 1], "each prompt found its own cache"
    for plan in plans:
        slots = [item[ITEM_SLOT] for item in plan["items"]]
        assert slots == sorted(slots) and len(slots) == 3
