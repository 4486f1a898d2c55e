"""The runner between the loop and an engine, with a fake engine: no model."""
import os

import pytest

from server.engine.native import (STATUS_ERROR, STATUS_RUNNING, STATUS_STOPPED, SUBMIT_ACCEPTED,
                           SamplingParams)
from server.engine.runner import ModelRunner
from server.http.errors import ApiError
from server.models.manager import LoadedModel


class FakeEngine:
    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        self.submitted, self.cancelled, self.events = [], [], []

    def fileno(self):
        return self.read_fd

    def submit(self, id_request, prompt, max_tokens, stop, sampling, owner=0):
        self.submitted.append(id_request)
        return SUBMIT_ACCEPTED

    def cancel(self, id_request):
        self.cancelled.append(id_request)

    def take_events(self):
        os.read(self.read_fd, 64)
        events, self.events = self.events, []
        return events

    def emit(self, *events):
        self.events.extend(events)
        os.write(self.write_fd, b"x")


def event(rid, text=b"", status=STATUS_RUNNING, error=None):
    return (rid, text, 1, status, 3, 0, 1, None, None, error)


def test_events_reach_their_choice_and_the_stream_ends(loop):
    engine = FakeEngine()
    runner = ModelRunner(loop, engine)
    stream = runner.generate([([1, 2], 4, SamplingParams()), ([1, 2], 4, SamplingParams())], [])
    first, second = engine.submitted
    engine.emit(event(second, b"b"), event(first, b"a", STATUS_STOPPED), event(second, b"!", STATUS_STOPPED))

    async def drain():
        return [(stream.choice[e[0]], e[1]) async for e in stream]

    assert loop.run_until_complete(drain()) == [(1, b"b"), (0, b"a"), (1, b"!")]
    runner.cancel(stream)
    assert engine.cancelled == []                     # both finished: nothing left to cancel


def test_unload_ends_open_streams_and_refuses_the_engine_afterwards(loop):
    engine = FakeEngine()
    runner = ModelRunner(loop, engine)
    stream = runner.generate([([1], 4, SamplingParams())], [])
    model = LoadedModel(manifest=None, runner=runner, context_length=64, created=0)
    assert model.engine is engine
    runner.end_all("the model was unloaded")

    async def last():
        return [e async for e in stream][-1]

    assert loop.run_until_complete(last())[3] == STATUS_ERROR
    for touch in (lambda: model.engine, lambda: runner.generate([([1], 1, SamplingParams())], []),
                  lambda: runner.embed([[1]])):
        with pytest.raises(ApiError) as refused:
            touch()
        assert refused.value.kind.status == 503
