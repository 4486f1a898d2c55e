"""What a hostile or unlucky request must not do to the engine: kill the process, corrupt the
KV cache for others, monopolize the slots or the queue, or keep working after its client left."""
import select

import pytest

from stackd.engine.core import (STATUS_ABORTED, STATUS_ERROR, STATUS_LENGTH, STATUS_RUNNING, STATUS_STOPPED, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE, Engine, SamplingParams)
from stackd.chat.grammar import json_schema_grammar
from stackd.store import defaults

from .conftest import Driver, chat_prompt

pytestmark = pytest.mark.slow


def test_min_tokens_yields_to_a_completed_grammar(driver, chat_engine):
    """It used to abort the process: end-of-generation was masked while the grammar allowed
    nothing else, and llama.cpp threw on the token it was then given."""
    grammar = json_schema_grammar({"type": "boolean"})
    rid = driver.submit(chat_prompt(chat_engine, "Is the sky blue?"), max_tokens=40,
                        min_tokens=20, grammar=grammar)
    result = driver.wait([rid])[rid]
    assert result["status"] == STATUS_STOPPED
    assert result["text"].strip() in (b"true", b"false")


def test_ignore_eos_with_a_grammar_stops_when_the_grammar_is_done(driver, chat_engine):
    grammar = json_schema_grammar({"type": "string", "maxLength": 5})
    rid = driver.submit(chat_prompt(chat_engine, "Say hi."), max_tokens=60, ignore_eos=True,
                        grammar=grammar)
    result = driver.wait([rid])[rid]
    assert result["status"] == STATUS_STOPPED and result["text"].startswith(b'"')


def test_a_grammar_checked_lazily_gives_the_same_greedy_output(driver, chat_engine):
    """Greedy output under a grammar that the model follows anyway is what it is without it."""
    prompt = chat_prompt(chat_engine, "Answer with one word: what color is grass?")
    free = driver.wait([driver.submit(prompt, max_tokens=12)])
    text = next(iter(free.values()))["text"]
    escaped = text.decode().replace("\\", "\\\\").replace('"', '\\"')
    grammar = f'root ::= "{escaped}"'
    constrained = driver.wait([driver.submit(prompt, max_tokens=12, grammar=grammar)])
    assert next(iter(constrained.values()))["text"] == text


def test_a_decode_failure_ends_its_plan_and_leaves_the_cache_consistent(driver, chat_engine):
    shared = "You are a helpful assistant who answers briefly. "
    prompts = [chat_prompt(chat_engine, shared + q) for q in ("Name a fruit.", "Name a tree.")]
    baseline = [driver.wait([rid])[rid]["text"] for rid in
                (driver.submit(p, max_tokens=16) for p in prompts)]
    # prime the slots with the shared prefix, then fail the next decode under two requests
    chat_engine.fail_next_decodes(1)
    failed = driver.wait([driver.submit(p, max_tokens=16) for p in prompts])
    # the requests in the failed step end with an error (one or both: the second may have
    # arrived a step later); nothing hangs
    assert STATUS_ERROR in {r["status"] for r in failed.values()}
    # the next requests, reusing whatever the scheduler still believes is cached, match
    again = [driver.wait([rid])[rid]["text"] for rid in
             (driver.submit(p, max_tokens=16) for p in prompts)]
    assert again == baseline
    ids = [driver.submit(p, max_tokens=16) for p in prompts]
    together = driver.wait(ids)
    assert [together[rid]["text"] for rid in ids] == baseline


def _first_event(driver, rid):
    while True:
        ready, _, _ = select.select([driver.engine.fileno()], [], [], 120)
        assert ready, "no event"
        for event in driver.engine.take_events():
            if event.id_request == rid:
                return event


def test_one_owner_holds_at_most_its_share_of_the_queue():
    engine = Engine(defaults.smollm2_path(), slots=1, context_length=256, max_queue=4,
                    key_share=0.5)
    driver = Driver(engine)
    try:
        prompt = chat_prompt(engine, "Tell me a long story.")
        busy = driver.submit(prompt, max_tokens=200, ignore_eos=True, owner=3)
        assert _first_event(driver, busy).status == STATUS_RUNNING      # the only slot is taken
        p = SamplingParams()
        verdicts = [engine.submit(100 + i, prompt, 4, [], p, 1) for i in range(3)]
        assert verdicts == [SUBMIT_ACCEPTED, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE]
        assert engine.submit(200, prompt, 4, [], p, 2) == SUBMIT_ACCEPTED   # another key is served
        for rid in (busy, 100, 101, 200):
            engine.cancel(rid)
    finally:
        engine.close()


def test_a_key_share_counts_running_requests_too():
    """How much of the engine one key holds must not depend on how fast its requests left the
    queue: key_share 0.5 of 4 slots + 8 queued is 6 requests, running or waiting."""
    engine = Engine(defaults.smollm2_path(), slots=4, context_length=256, max_queue=8, key_share=0.5)
    driver = Driver(engine)
    try:
        prompt = chat_prompt(engine, "Tell me a long story.")
        running = [driver.submit(prompt, max_tokens=200, ignore_eos=True, owner=1) for _ in range(4)]
        for rid in running:
            assert _first_event(driver, rid).status == STATUS_RUNNING    # out of the queue
        p = SamplingParams()
        verdicts = [engine.submit(100 + i, prompt, 4, [], p, 1) for i in range(4)]
        assert verdicts == [SUBMIT_ACCEPTED, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE, SUBMIT_OVER_SHARE]
        for rid in running + [100, 101]:
            engine.cancel(rid)
        driver.wait(running + [100, 101])
        # cancelled, they give their share back
        assert [engine.submit(200 + i, prompt, 4, [], p, 1) for i in range(6)] == [SUBMIT_ACCEPTED] * 6
        for i in range(6):
            engine.cancel(200 + i)
        driver.wait([200 + i for i in range(6)])
    finally:
        engine.close()


def test_a_bystander_is_not_stuck_behind_a_key_that_took_every_slot():
    """One key alone takes every slot (free slots are never left idle); another key's request
    then takes one back (the flood's request resumes later, recomputed) instead of waiting for
    the flood's longest generation, and the flood's requests still make all their tokens."""
    engine = Engine(defaults.smollm2_path(), slots=4, context_length=512, key_share=0.5)
    driver = Driver(engine)
    try:
        prompt = chat_prompt(engine, "Tell me a long story.")
        flood = [driver.submit(prompt, max_tokens=150, ignore_eos=True, owner=1) for _ in range(4)]
        for rid in flood:
            assert _first_event(driver, rid).status == STATUS_RUNNING
        bystander = driver.submit(chat_prompt(engine, "Say hi."), max_tokens=2, owner=2)
        order, generated = [], {}
        while len(order) < 5:
            ready, _, _ = select.select([engine.fileno()], [], [], 300)
            assert ready, f"no events; finished so far {order}"
            for event in engine.take_events():
                generated[event.id_request] = event.n_generated
                if event.status != STATUS_RUNNING:
                    order.append((event.id_request, event.status))
        assert order[0] == (bystander, STATUS_LENGTH), order
        assert {status for _, status in order} == {STATUS_LENGTH}
        assert [generated[rid] for rid in flood] == [150] * 4
    finally:
        engine.close()


def test_a_preempted_request_counts_as_waiting():
    """The waiting gauge counts a request that gave its slot back: it waits again, though no
    longer in the engine's queue (every request is running or waiting, none in between)."""
    engine = Engine(defaults.smollm2_path(), slots=2, context_length=512, key_share=0.5)
    driver = Driver(engine)
    try:
        prompt = chat_prompt(engine, "Tell me a long story.")
        flood = [driver.submit(prompt, max_tokens=300, ignore_eos=True, owner=1) for _ in range(2)]
        for rid in flood:
            assert _first_event(driver, rid).status == STATUS_RUNNING
        bystander = driver.submit(prompt, max_tokens=300, ignore_eos=True, owner=2)
        assert _first_event(driver, bystander).status == STATUS_RUNNING
        gauges = engine.metrics()["gauges"]
        assert (gauges["num_requests_running"], gauges["num_requests_waiting"]) == (2, 1)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def embed_engine():
    engine = Engine(defaults.minilm_path(), embeddings=True, slots=16, context_length=512)
    yield engine
    engine.close()


def _finish_order(engine, ids, timeout=300.0):
    order = []
    while len(order) < len(ids):
        ready, _, _ = select.select([engine.fileno()], [], [], timeout)
        assert ready, f"no events; finished so far {order}"
        for event in engine.take_events():
            if event.id_request in ids and event.status != STATUS_RUNNING:
                order.append((event.id_request, event.status))
    return order


def test_a_small_embedding_is_not_stuck_behind_a_large_one(embed_engine):
    words = embed_engine.tokenize("a fairly ordinary sentence to embed", True, False)
    assert embed_engine.submit_embedding(1, [words] * 1024) == SUBMIT_ACCEPTED
    assert embed_engine.submit_embedding(2, [words]) == SUBMIT_ACCEPTED
    order = _finish_order(embed_engine, {1, 2})
    assert [rid for rid, _ in order] == [2, 1]


def test_an_abandoned_embedding_job_stops_between_batches(embed_engine):
    words = embed_engine.tokenize("a fairly ordinary sentence to embed", True, False)
    before = embed_engine.stats()["n_tokens_decoded"]
    assert embed_engine.submit_embedding(3, [words] * 2048) == SUBMIT_ACCEPTED
    embed_engine.cancel(3)
    assert _finish_order(embed_engine, {3}) == [(3, STATUS_ABORTED)]
    decoded = embed_engine.stats()["n_tokens_decoded"] - before
    assert decoded < len(words) * 2048 // 4       # most of the job never ran


def test_a_reduced_power_budget_admits_fewer_slots():
    engine = Engine(defaults.smollm2_path(), slots=4, context_length=256)
    driver = Driver(engine)
    try:
        engine.set_compute_scale(0.25)                 # one slot of four, one thread
        prompt = chat_prompt(engine, "Name a color.")
        first, second = driver.submit(prompt, max_tokens=6), driver.submit(prompt, max_tokens=6)
        order = []
        driver.wait([first, second], on_event=lambda e: order.append((e.id_request, e.status != STATUS_RUNNING)))
        # the second is admitted only once the first has finished
        assert order.index((first, True)) < next(i for i, (rid, _) in enumerate(order) if rid == second)
    finally:
        engine.close()


def test_a_key_with_three_streams_gets_about_the_engine_time_of_a_key_with_one():
    """time_share.h: while two keys run, the one with three sequences sits some of them out,
    so in the steps of the other key's 30 tokens it makes far fewer than 3 x 30 (about 30)."""
    engine = Engine(defaults.smollm2_path(), slots=4, context_length=512, key_share=0.5)
    driver = Driver(engine)
    try:
        prompt = chat_prompt(engine, "Tell me a long story.")
        heavy = [driver.submit(prompt, max_tokens=400, ignore_eos=True, owner=1) for _ in range(3)]
        for rid in heavy:
            assert _first_event(driver, rid).status == STATUS_RUNNING
        light = driver.submit(prompt, max_tokens=30, ignore_eos=True, owner=2)
        tokens = {"heavy": 0, "light": 0}
        while tokens["light"] < 30:
            ready, _, _ = select.select([engine.fileno()], [], [], 120)
            assert ready, "no event"
            for event in engine.take_events():
                tokens["light" if event.id_request == light else "heavy"] += event.n_tokens
        # Without the share all three step with it: 90 tokens and more. With it about 30-45 on
        # a quiet machine; a loaded one has given 63 (sampling is charged by measured time,
        # and a sample preempted by another process charges its key for the wait).
        assert tokens["heavy"] < 80, tokens
        for rid in heavy:
            engine.cancel(rid)
        driver.wait(heavy)
    finally:
        engine.close()
