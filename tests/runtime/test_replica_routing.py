"""The router over a model's replicas (runtime/replicas.py), with fake replicas: the layer under
test is the routing (capacity, prefix affinity, key share over the set, retry before the first
token); the real replicas and their stream are tests/placement/test_replicas.py's."""
from __future__ import annotations

import asyncio
import types

import pytest

from stackd.engine.core import STATUS_RUNNING, STATUS_STOPPED
from stackd.engine.errors import EndedEvent, EngineError, ErrorCode
from stackd.runtime import replicas as routing
from stackd.runtime.runner import Generation


class Event:
    def __init__(self, rid, status, text=b"x"):
        self.id_request, self.status, self.text = rid, status, text


class FakeReplica:
    """A replica whose requests the test drives: `emit(stream, ...)`, `fail(...)`."""
    remote = True

    def __init__(self, loop, node_id, n_slots=2, refuse=None):
        self.loop, self.node_id, self.n_slots, self.refuse = loop, node_id, n_slots, refuse
        self.in_flight, self.alive, self.pid = 0, True, 1
        self.streams: list[Generation] = []
        self.ids = iter(range(1000))

    async def generate(self, jobs, stop, owner):
        if self.refuse is not None:
            raise EngineError(self.refuse, "refused")
        stream = Generation(self.loop)
        for _ in jobs:
            stream.choice[next(self.ids)] = len(stream.choice)
        stream.n_open = len(jobs)
        self.streams.append(stream)
        return stream

    def cancel(self, stream):
        pass

    def end_all(self, error):
        self.alive = False
        for stream in self.streams:
            for rid in stream.choice:
                stream.push(EndedEvent(rid, 4, error))

    async def stop(self):
        pass

    def describe(self):
        return {"node": self.node_id}


def replica_set(loop, *replicas, key_share=1.0, max_queue=0):
    first, *rest = replicas
    s = routing.ReplicaSet(loop, first, key_share, max_queue)
    for r in rest:
        s.add(r)
    return s


JOB = ([1] * 10, 4, None)


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, 60))


def test_the_replica_with_most_free_capacity_takes_the_request(loop):
    a, b = FakeReplica(loop, "a"), FakeReplica(loop, "b", n_slots=4)
    s = replica_set(loop, a, b)
    run(loop, s.generate([JOB], [], 1))          # a: 0/2, b: 0/4 -> a (ties go to the first)
    run(loop, s.generate([JOB], [], 1))          # a: 1/2, b: 0/4 -> b
    run(loop, s.generate([JOB], [], 1))          # a: 1/2, b: 1/4 -> b
    assert (a.in_flight, b.in_flight) == (1, 2)


def test_a_shared_prefix_goes_back_to_its_replica_unless_it_is_far_busier(loop):
    a, b = FakeReplica(loop, "a"), FakeReplica(loop, "b")
    s = replica_set(loop, a, b)
    prefix = list(range(routing.AFFINITY_BLOCK))
    busy = run(loop, s.generate([JOB], [], 1))                       # a
    first = run(loop, s.generate([(prefix + [1], 4, None)], [], 1))  # b
    assert first.replica is b
    second = run(loop, s.generate([(prefix + [2], 4, None)], [], 1))  # a and b even: b holds the prefix
    assert second.replica is b
    # b is busier than a by more than AFFINITY_SLACK requests per slot now: the prefix goes elsewhere
    b.in_flight += int(routing.AFFINITY_SLACK * b.n_slots) + 1
    third = run(loop, s.generate([(prefix + [3], 4, None)], [], 1))
    assert third.replica is a
    assert busy.replica is a
    short = list(range(routing.AFFINITY_BLOCK - 1))                   # under one block: no affinity
    assert s._prefix_keys(short) == []


def test_a_key_holds_its_share_of_the_whole_set(loop):
    a, b = FakeReplica(loop, "a"), FakeReplica(loop, "b")
    s = replica_set(loop, a, b, key_share=0.5, max_queue=2)   # capacity (2 + 2) * 2 = 8: 4 a key
    for _ in range(4):
        run(loop, s.generate([JOB], [], 7))
    assert (a.in_flight, b.in_flight) == (2, 2)                # spread over both replicas
    with pytest.raises(EngineError) as refused:
        run(loop, s.generate([JOB], [], 7))
    assert refused.value.code is ErrorCode.OVER_SHARE
    run(loop, s.generate([JOB], [], 8))                        # another key has room


def test_a_replica_that_refuses_passes_the_request_on(loop):
    a, b = FakeReplica(loop, "a", refuse=ErrorCode.QUEUE_FULL), FakeReplica(loop, "b")
    s = replica_set(loop, a, b)
    assert run(loop, s.generate([JOB], [], 1)).replica is b
    b.refuse = ErrorCode.QUEUE_FULL
    with pytest.raises(EngineError) as refused:
        run(loop, s.generate([JOB], [], 1))
    assert refused.value.code is ErrorCode.QUEUE_FULL


def test_a_lost_replica_retries_requests_without_a_token_and_ends_the_others(loop):
    a, b = FakeReplica(loop, "a"), FakeReplica(loop, "b")
    s = replica_set(loop, a, b)
    streaming = run(loop, s.generate([JOB], [], 1))      # a
    waiting = run(loop, s.generate([JOB], [], 1))        # b
    started = run(loop, s.generate([JOB], [], 1))        # a
    assert (streaming.replica, waiting.replica, started.replica) == (a, b, a)
    (rid,) = started.choice
    started.inner.push(Event(rid, STATUS_RUNNING))
    assert run(loop, started.__anext__()).status == STATUS_RUNNING   # a token went to the client
    s.replica_lost(a, "node a went down")
    assert a not in s.replicas and list(s.lost_nodes) == ["a"]

    async def first(stream):
        return await stream.__anext__()
    retried_task = loop.create_task(first(streaming))
    loop.run_until_complete(asyncio.sleep(0.01))
    assert streaming.replica is b                         # submitted again, nothing seen
    (rid,) = streaming.choice
    streaming.inner.push(Event(rid, STATUS_STOPPED))
    assert run(loop, retried_task).status == STATUS_STOPPED
    ended = run(loop, started.__anext__())
    assert ended.status != STATUS_RUNNING and ended.error.code is ErrorCode.WORKER_LOST
    s.replica_lost(b, "node b went down")                 # no replica left: the error stands
    ended = run(loop, waiting.__anext__())
    assert ended.error.code is ErrorCode.WORKER_LOST
    with pytest.raises(EngineError):
        run(loop, s.generate([JOB], [], 1))


def test_a_lost_replica_retries_an_answer_sent_at_the_end_even_midway(loop):
    """A non-streaming answer (its consumer set start_over) has sent the client nothing: lost
    midway, it starts over on another replica; unloading ends it without a retry."""
    a, b = FakeReplica(loop, "a"), FakeReplica(loop, "b")
    s = replica_set(loop, a, b)
    buffered = run(loop, s.generate([JOB], [], 1))        # a
    resets = []
    buffered.start_over = lambda: resets.append(1)
    (rid,) = buffered.choice
    buffered.inner.push(Event(rid, STATUS_RUNNING))
    assert run(loop, buffered.__anext__()).status == STATUS_RUNNING
    s.replica_lost(a, "node a went down")
    task = loop.create_task(buffered.__anext__())
    loop.run_until_complete(asyncio.sleep(0.01))
    assert buffered.replica is b and resets == [1]
    (rid,) = buffered.choice
    buffered.inner.push(Event(rid, STATUS_STOPPED))
    assert run(loop, task).status == STATUS_STOPPED
    unloading = run(loop, s.generate([JOB], [], 1))       # b
    unloading.start_over = lambda: resets.append(2)
    s.local.runner = types.SimpleNamespace(end_all=lambda error: None)   # the fake leader's own
    s.end_all(EngineError(ErrorCode.UNLOADED, "the model was unloaded"))
    b.end_all(EngineError(ErrorCode.UNLOADED, "the model was unloaded"))
    assert run(loop, unloading.__anext__()).error.code is ErrorCode.UNLOADED and resets == [1]
