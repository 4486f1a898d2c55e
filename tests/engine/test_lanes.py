"""Lanes (engine.h): several contexts of one model, each with its share of the slots, stepping
on threads of their own. A multi-node layer split gets one per node so that one lane's step
runs on a follower while another's runs on the leader; here they run on this CPU, which is
enough to check what lanes must keep: every answer as one lane gives it, new requests going
to whichever lane has room, cancellation in the shared queue, the gauges summed over lanes."""
import pytest

from stackd.engine.core import STATUS_ABORTED, STATUS_LENGTH, STATUS_RUNNING, Engine
from stackd.store import defaults

from .conftest import Driver, chat_prompt
from .test_engine import QUESTIONS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_lanes():
    engine = Engine(defaults.smollm2_path(), slots=4, context_length=512, batch=256, n_lanes=2)
    yield engine
    engine.close()


def test_slots_are_shared_out_and_lanes_never_outnumber_slots():
    one_slot = Engine(defaults.smollm2_path(), slots=1, context_length=256, n_lanes=4)
    try:
        assert one_slot.n_lanes == 1
    finally:
        one_slot.close()
    embedder = Engine(defaults.minilm_path(), embeddings=True, slots=4, n_lanes=2)
    try:
        assert embedder.n_lanes == 1                  # an embedding step has no second stage
    finally:
        embedder.close()


def test_greedy_answers_over_two_lanes_equal_one_lane(two_lanes, chat_engine):
    one, two = Driver(chat_engine), Driver(two_lanes)
    assert two_lanes.n_lanes == 2
    prompts = [chat_prompt(chat_engine, q) for q in QUESTIONS[:6]]      # more than the 4 slots
    alone = one.wait([one.submit(p, max_tokens=20) for p in prompts])
    ids = [two.submit(p, max_tokens=20) for p in prompts]
    together = two.wait(ids)
    for (_, a), rid in zip(sorted(alone.items()), ids):
        assert (together[rid]["status"], together[rid]["text"]) == (a["status"], a["text"])


def test_a_request_cancelled_in_the_shared_queue_never_runs(two_lanes):
    driver = Driver(two_lanes)
    prompt = chat_prompt(two_lanes, "Write an essay.")
    busy = [driver.submit(prompt, max_tokens=200, ignore_eos=True) for _ in range(4)]   # every slot
    queued = driver.submit(prompt, max_tokens=50)
    two_lanes.cancel(queued)
    after = driver.submit(prompt, max_tokens=3)
    for rid in busy:
        two_lanes.cancel(rid)
    results = driver.wait(busy + [queued, after])
    assert results[queued]["status"] == STATUS_ABORTED
    assert sum(e.n_tokens for e in results[queued]["events"]) == 0
    assert results[after]["status"] == STATUS_LENGTH


def test_gauges_count_the_slots_of_every_lane(two_lanes):
    driver = Driver(two_lanes)
    prompt = chat_prompt(two_lanes, "Tell me a story.")
    seen = []
    ids = [driver.submit(prompt, max_tokens=40, ignore_eos=True) for _ in range(4)]
    driver.wait(ids, on_event=lambda _: seen.append(two_lanes.metrics()["gauges"]["slots_busy"]))
    assert max(seen) == 4                             # two lanes of two, both full at once
    assert two_lanes.metrics()["gauges"]["slots_busy"] == 0


def test_the_shared_queue_goes_first_to_the_owner_holding_fewest_slots(two_lanes):
    driver = Driver(two_lanes)
    prompt = chat_prompt(two_lanes, "Write an essay.")
    flood = [driver.submit(prompt, max_tokens=40, ignore_eos=True, owner=1) for _ in range(12)]  # 4 run, 8 wait
    other = driver.submit(prompt, max_tokens=3, owner=2)
    ended = []
    driver.wait(flood + [other], timeout=300,
                on_event=lambda e: ended.append(e.id_request) if e.status != STATUS_RUNNING else None)
    # Taken in order of arrival, the other key's request would wait for two waves of the flood.
    # Taken owner by owner, it runs as soon as the first wave frees a slot.
    assert ended.index(other) < min(ended.index(rid) for rid in flood[4:])
