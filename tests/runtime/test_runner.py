"""The runner between the loop and an engine client, with a fake client: no model."""
import asyncio
import os

import pytest

from stackd.engine.errors import EngineError, ErrorCode
from stackd.engine.core import (STATUS_ERROR, STATUS_RUNNING, STATUS_STOPPED, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE, SUBMIT_QUEUE_FULL, Event, SamplingParams)
from stackd.runtime.runner import ModelRunner
from stackd.api.errors import api_error
from stackd.runtime.loaded_model import LoadedModel


class FakeClient:
    """The engine-client interface (clients.InlineEngine / WorkerEngine) over a pipe."""

    lost = False

    def __init__(self, verdict=SUBMIT_ACCEPTED):
        self.read_fd, self.write_fd = os.pipe()
        self.submitted, self.cancelled, self.events = [], [], []
        self.verdict = verdict

    def fileno(self):
        return self.read_fd

    async def submit_jobs(self, jobs, stop, owner):
        self.submitted += [job[0] for job in jobs]
        return self.verdict, None

    async def submit_embedding(self, rid, inputs, owner):
        self.submitted.append(rid)
        return self.verdict

    def cancel(self, rid):
        self.cancelled.append(rid)

    def take_events(self):
        os.read(self.read_fd, 64)
        events, self.events = self.events, []
        return events

    def emit(self, *events):
        self.events.extend(events)
        os.write(self.write_fd, b"x")


def event(rid, text=b"", status=STATUS_RUNNING, error=None):
    return Event(id_request=rid, text=text, n_tokens=1, status=status, n_prompt=3, n_generated=1,
                 error=error or "")


def test_events_reach_their_choice_and_the_stream_ends(loop):
    engine = FakeClient()
    runner = ModelRunner(loop, engine)
    stream = loop.run_until_complete(
        runner.generate([([1, 2], 4, SamplingParams()), ([1, 2], 4, SamplingParams())], []))
    first, second = engine.submitted
    engine.emit(event(second, b"b"), event(first, b"a", STATUS_STOPPED), event(second, b"!", STATUS_STOPPED))

    async def drain():
        return [(stream.choice[e.id_request], e.text) async for e in stream]

    assert loop.run_until_complete(drain()) == [(1, b"b"), (0, b"a"), (1, b"!")]
    runner.cancel(stream)
    assert engine.cancelled == []                     # both finished: nothing left to cancel


def test_unload_ends_open_streams_and_refuses_the_engine_afterwards(loop):
    engine = FakeClient()
    runner = ModelRunner(loop, engine)
    stream = loop.run_until_complete(runner.generate([([1], 4, SamplingParams())], []))
    model = LoadedModel(manifest=None, runner=runner, context_length=64, created=0)
    assert model.engine is engine
    runner.end_all(EngineError(ErrorCode.UNLOADED, "the model was unloaded"))

    async def last():
        return [e async for e in stream][-1]

    assert loop.run_until_complete(last()).status == STATUS_ERROR
    for touch in (lambda: model.engine,
                  lambda: loop.run_until_complete(runner.generate([([1], 1, SamplingParams())], [])),
                  lambda: loop.run_until_complete(runner.embed([[1]]))):
        with pytest.raises(EngineError) as refused:
            touch()
        assert refused.value.code is ErrorCode.UNLOADED
        assert api_error(refused.value).kind.status == 503


@pytest.mark.parametrize("verdict, code, status", [(SUBMIT_QUEUE_FULL, ErrorCode.QUEUE_FULL, 503),
                                                   (SUBMIT_OVER_SHARE, ErrorCode.OVER_SHARE, 429)])
def test_a_refused_submission_leaves_nothing_behind(loop, verdict, code, status):
    engine = FakeClient(verdict)
    runner = ModelRunner(loop, engine)
    with pytest.raises(EngineError) as refused:
        loop.run_until_complete(runner.generate([([1], 4, SamplingParams())] * 3, []))
    assert refused.value.code is code and api_error(refused.value).kind.status == status
    assert dict(api_error(refused.value).headers)[b"retry-after"] == b"1"
    engine.emit(event(engine.submitted[0], b"late"))  # an event for a refused choice is dropped
    loop.run_until_complete(__import__("asyncio").sleep(0.01))
    assert runner._streams == {}


# ---- a worker that dies: requests without an event yet go to the restarted one (Held) ----------

def lost_event(rid):
    from stackd.engine.errors import EndedEvent
    return EndedEvent(rid, STATUS_ERROR, EngineError(ErrorCode.WORKER_LOST, "the worker died"))


def restartable(loop, fresh_runner=None, error=None):
    """A model's own runner whose restarted() gives `fresh_runner` (or raises `error`)."""
    runner = ModelRunner(loop, FakeClient())
    calls = []

    async def restarted():
        calls.append(1)
        if error is not None:
            raise error
        return fresh_runner
    runner.restarted = restarted
    return runner, calls


def test_a_request_lost_before_its_first_event_runs_on_the_restarted_worker(loop):
    fresh = ModelRunner(loop, FakeClient())
    runner, calls = restartable(loop, fresh)
    stream = loop.run_until_complete(runner.generate([([1], 4, SamplingParams())], []))
    (rid,) = runner.engine.submitted
    runner.engine.emit(lost_event(rid))

    async def drain():
        return [(stream.choice[e.id_request], e.text, e.status) async for e in stream]

    async def answer_when_resubmitted():
        while not fresh.engine.submitted:
            await asyncio.sleep(0.01)
        fresh.engine.emit(event(fresh.engine.submitted[0], b"hi", STATUS_STOPPED))

    out, _ = loop.run_until_complete(asyncio.gather(drain(), answer_when_resubmitted()))
    assert out == [(0, b"hi", STATUS_STOPPED)] and calls == [1]
    runner.cancel(stream)                             # the client's cancel reaches the fresh engine
    assert fresh.engine.cancelled == [] and runner.engine.cancelled == []


def test_a_request_that_had_an_event_is_not_resubmitted(loop):
    fresh = ModelRunner(loop, FakeClient())
    runner, calls = restartable(loop, fresh)
    stream = loop.run_until_complete(runner.generate([([1], 4, SamplingParams())], []))
    (rid,) = runner.engine.submitted
    runner.engine.emit(event(rid, b"a"), lost_event(rid))

    async def drain():
        return [e.status async for e in stream]

    assert loop.run_until_complete(drain()) == [STATUS_RUNNING, STATUS_ERROR]
    assert calls == [] and fresh.engine.submitted == []


def lost_midway(loop, text: bytes):
    """A request on a restartable runner that had one event (`text`) when its worker died:
    (runner, the restarted one, restarted() calls, the request's stream)."""
    fresh = ModelRunner(loop, FakeClient())
    runner, calls = restartable(loop, fresh)
    stream = loop.run_until_complete(runner.generate([([1], 4, SamplingParams())], []))
    (rid,) = runner.engine.submitted
    runner.engine.emit(event(rid, text), lost_event(rid))
    return runner, fresh, calls, stream


async def when_resubmitted(fresh, events):
    """Once the request reaches the restarted runner, its engine emits events(request id)."""
    while not fresh.engine.submitted:
        await asyncio.sleep(0.01)
    fresh.engine.emit(*events(fresh.engine.submitted[0]))


def test_an_answer_sent_at_the_end_is_gathered_anew_after_a_loss_midway(loop):
    """A non-streaming answer has sent nothing when the worker dies mid-generation: its jobs go
    to the restarted worker and the answer holds only the new generation's text."""
    from stackd.api.inference import generate
    runner, fresh, calls, stream = lost_midway(loop, b"half an ans")
    answer = when_resubmitted(fresh, lambda rid: (event(rid, b"whole", STATUS_RUNNING),
                                                  event(rid, b" answer", STATUS_STOPPED)))
    (choice,), _ = loop.run_until_complete(asyncio.gather(generate.collect(runner, stream, 1), answer))
    assert choice.joined() == "whole answer" and choice.finish_reason == "stop" and calls == [1]


def test_an_answer_sent_at_the_end_is_resubmitted_once(loop):
    """The restarted worker dies too: the loss stands (a 503), no loop of retries."""
    from stackd.api.inference import generate
    from stackd.http.errors import ApiError
    runner, fresh, calls, stream = lost_midway(loop, b"a")
    lost_again = when_resubmitted(fresh, lambda rid: (event(rid, b"b"), lost_event(rid)))
    with pytest.raises(ApiError) as raised:
        loop.run_until_complete(asyncio.gather(generate.collect(runner, stream, 1), lost_again))
    assert raised.value.kind.status == 503 and calls == [1]


def test_a_restart_that_does_not_come_leaves_the_loss_standing(loop):
    runner, calls = restartable(loop, error=EngineError(ErrorCode.RESTARTING, "still restarting"))
    stream = loop.run_until_complete(runner.generate([([1], 4, SamplingParams())], []))
    (rid,) = runner.engine.submitted
    runner.engine.emit(lost_event(rid))

    async def drain():
        return [e async for e in stream]

    (last,) = loop.run_until_complete(drain())
    assert last.status == STATUS_ERROR and last.error.code is ErrorCode.WORKER_LOST and calls == [1]


def test_a_submit_to_a_lost_worker_waits_for_the_restarted_one(loop):
    fresh = ModelRunner(loop, FakeClient())
    runner, calls = restartable(loop, fresh)
    runner.engine.lost = True

    async def refused(*_):
        raise EngineError(ErrorCode.WORKER_LOST, "not running")
    runner.engine.submit_jobs = refused
    stream = loop.run_until_complete(runner.generate([([1], 4, SamplingParams())], []))
    assert calls == [1] and list(stream.choice) == fresh.engine.submitted
