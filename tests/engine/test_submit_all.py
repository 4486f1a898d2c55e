"""A request's n choices go into the engine as one native call (engine.h, submit_all): every one
or none, at the edge of the queue and of a key's share, under the engine's own lock; a refused
request leaves the queue as it was (nothing taken, nothing to cancel). A real engine on SmolLM2:
the layer under test is the engine's admission, so no fake stands in for it."""
import select

import pytest

from stackd.engine.core import (STATUS_RUNNING, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE, SUBMIT_QUEUE_FULL, Engine,
                                SamplingParams)
from stackd.engine.submit import VERDICT_BAD_GRAMMAR, submit_all
from stackd.store import defaults

from .conftest import Driver, chat_prompt

pytestmark = pytest.mark.slow


def running(driver, rid):
    """Waits for the request's first event: it holds the only slot, out of the queue."""
    while True:
        ready, _, _ = select.select([driver.engine.fileno()], [], [], 120)
        assert ready, "no event"
        for event in driver.engine.take_events():
            if event.id_request == rid:
                assert event.status == STATUS_RUNNING
                return


def jobs(prompt, first_id, n, grammar_of=None):
    out = []
    for i in range(n):
        sampling = SamplingParams()
        if grammar_of is not None:
            sampling.grammar = grammar_of(i)
        out.append((first_id + i, prompt, 4, sampling))
    return out


def cancel_all(driver, ids):
    for rid in ids:
        driver.engine.cancel(rid)
    driver.wait(ids)


@pytest.fixture
def one_slot_engine(request):
    """One slot, taken by a long generation of owner 3, so what comes next waits in the queue."""
    engine = Engine(defaults.smollm2_path(), slots=1, context_length=256, **request.param)
    driver = Driver(engine)
    prompt = chat_prompt(engine, "Tell me a long story.")
    busy = driver.submit(prompt, max_tokens=200, ignore_eos=True, owner=3)
    running(driver, busy)
    yield driver, prompt
    engine.cancel(busy)
    engine.close()


@pytest.mark.parametrize("one_slot_engine", [{"max_queue": 3}], indirect=True)
def test_choices_one_more_than_the_queue_has_room_for_take_none(one_slot_engine):
    driver, prompt = one_slot_engine
    engine = driver.engine
    assert engine.submit_all(jobs(prompt, 100, 4), [], 1) == SUBMIT_QUEUE_FULL
    # untouched: all three places are still there, and then none is
    assert engine.submit_all(jobs(prompt, 200, 3), [], 1) == SUBMIT_ACCEPTED
    assert engine.submit_all(jobs(prompt, 300, 1), [], 2) == SUBMIT_QUEUE_FULL
    cancel_all(driver, [200, 201, 202])
    assert engine.submit_all(jobs(prompt, 400, 3), [], 1) == SUBMIT_ACCEPTED   # their places came back
    cancel_all(driver, [400, 401, 402])


@pytest.mark.parametrize("one_slot_engine", [{"max_queue": 4, "key_share": 0.5}], indirect=True)
def test_choices_past_a_keys_share_take_none_and_another_key_is_served(one_slot_engine):
    """key_share 0.5 of 1 slot + 4 queued is 2 requests a key, running or waiting."""
    driver, prompt = one_slot_engine
    engine = driver.engine
    assert engine.submit_all(jobs(prompt, 100, 3), [], 1) == SUBMIT_OVER_SHARE
    assert engine.submit_all(jobs(prompt, 200, 2), [], 1) == SUBMIT_ACCEPTED
    assert engine.submit_all(jobs(prompt, 300, 1), [], 1) == SUBMIT_OVER_SHARE
    # the queue's 2 places left go to another key: the queue is refused before the share
    assert engine.submit_all(jobs(prompt, 400, 3), [], 2) == SUBMIT_QUEUE_FULL
    assert engine.submit_all(jobs(prompt, 500, 2), [], 2) == SUBMIT_ACCEPTED
    cancel_all(driver, [200, 201, 500, 501])


@pytest.mark.parametrize("one_slot_engine", [{"max_queue": 3}], indirect=True)
def test_a_bad_grammar_in_any_choice_takes_none(one_slot_engine):
    driver, prompt = one_slot_engine
    bad_second = jobs(prompt, 100, 3, grammar_of=lambda i: "root ::= (" if i == 1 else "")
    verdict, error = submit_all(driver.engine, bad_second, [], 1)
    assert verdict == VERDICT_BAD_GRAMMAR and error
    assert driver.engine.submit_all(jobs(prompt, 200, 3), [], 1) == SUBMIT_ACCEPTED   # all 3 places left
    cancel_all(driver, [200, 201, 202])


@pytest.mark.parametrize("one_slot_engine", [{"max_queue": 2}], indirect=True)
def test_a_full_queue_is_the_verdict_before_a_later_choices_bad_grammar(one_slot_engine):
    """As one submit after another would answer: choice 2 is refused by the queue before its
    grammar is read."""
    driver, prompt = one_slot_engine
    bad_third = jobs(prompt, 100, 3, grammar_of=lambda i: "root ::= (" if i == 2 else "")
    assert driver.engine.submit_all(bad_third, [], 1) == SUBMIT_QUEUE_FULL
