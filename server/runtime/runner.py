"""One loaded model on the event loop's side: submit work, receive events.

The engine (in this process: its eventfd; in a worker: the worker's socket) is watched with
add_reader (no polling, no thread hop through call_soon_threadsafe) and each event goes to the
stream of the request it belongs to. Errors are EngineErrors with a code; the inference layer
maps them to HTTP in one place (server/api/errors.py).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading

from ..engine.errors import EndedEvent, EngineError, ErrorCode
from ..engine.core import (FINISH_REASONS, STATUS_ERROR, STATUS_RUNNING, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE, SUBMIT_QUEUE_FULL, SamplingParams)


class Generation:
    """The events of one or more engine requests (the choices of one API request), as an
    async iterator that ends once every request has sent its finishing event."""

    __slots__ = ("choice", "_events", "_waiter", "_loop", "n_open")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.choice: dict[int, int] = {}    # engine request id -> choice index
        self._events: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._loop = loop
        self.n_open = 0

    @property
    def finished(self) -> bool:
        return self.n_open == 0 and not self._events

    def push(self, event) -> None:
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self._events:
            if self.n_open == 0:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        event = self._events.popleft()
        if event.status != STATUS_RUNNING:
            self.n_open -= 1
        return event


def finish_reason(status: int) -> str | None:
    return FINISH_REASONS[status]


class ModelRunner:
    """Bridges one model's engine client (in this process or a worker) to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, engine):
        self.loop = loop
        self.engine = engine          # clients.InlineEngine or clients.WorkerEngine
        self._streams: dict[int, Generation] = {}
        self._ids = itertools.count(1)
        self.closing = False          # set on the loop thread before the engine is freed elsewhere
        self._leases = 0              # threads using the engine's vocabulary right now
        self._lease_lock = threading.Condition()
        loop.add_reader(engine.fileno(), self._on_events)

    @contextlib.contextmanager
    def lease(self):
        """Use the engine from another thread (tokenizing off the loop); closing waits for it."""
        with self._lease_lock:
            if self.closing:
                raise EngineError(ErrorCode.UNLOADED, "the model was unloaded")
            self._leases += 1
        try:
            yield self.engine
        finally:
            with self._lease_lock:
                self._leases -= 1
                self._lease_lock.notify_all()

    async def generate(self, jobs: list[tuple[list[int], int, SamplingParams]],
                       stop: list[str], owner: int = 0) -> Generation:
        """Submit one engine request per (prompt, max_tokens, sampling) job; job i is choice i.
        `owner` (the API key) is the unit of the fair share of slots and queue. All choices are
        taken or none."""
        self.check_open()
        stream = Generation(self.loop)
        submitted = []
        for index, (prompt, max_tokens, sampling) in enumerate(jobs):
            rid = next(self._ids)
            stream.choice[rid] = index
            self._streams[rid] = stream            # events may arrive before the verdict
            submitted.append((rid, prompt, max_tokens, sampling))
        stream.n_open = len(submitted)
        return await self._taken(stream, self.engine.submit_jobs(submitted, stop, owner))

    async def embed(self, inputs: list[list[int]], owner: int = 0) -> Generation:
        self.check_open()
        rid = next(self._ids)
        stream = Generation(self.loop)
        stream.choice[rid] = 0
        stream.n_open = 1
        self._streams[rid] = stream

        async def submission():
            return await self.engine.submit_embedding(rid, inputs, owner), None
        return await self._taken(stream, submission())

    async def _taken(self, stream: Generation, submission) -> Generation:
        """The stream, once the engine took its requests; if it refused them (or the submit
        failed), the stream is forgotten and the refusal raised."""
        try:
            verdict, error = await submission
        except BaseException:
            self._forget(stream)
            raise
        if verdict != SUBMIT_ACCEPTED:
            self._forget(stream)
            raise refused(verdict, error)
        return stream

    def _forget(self, stream: Generation) -> None:
        for rid in stream.choice:
            self._streams.pop(rid, None)

    def cancel(self, stream: Generation) -> None:
        """The client went away (or the request failed): free the slots at the next step."""
        for rid in stream.choice:
            if self._streams.pop(rid, None) is not None:
                self.engine.cancel(rid)

    def _on_events(self) -> None:
        streams = self._streams
        for event in self.engine.take_events():
            stream = streams.get(event.id_request)
            if stream is None:
                continue                   # cancelled already
            if event.status != STATUS_RUNNING:
                del streams[event.id_request]
            stream.push(event)

    def end_all(self, error: EngineError) -> None:
        """Finish every open request with an error event (on the loop thread), and stop
        listening to the engine: used when the model is unloaded under its requests."""
        with self._lease_lock:
            self.closing = True
        if not self.engine.lost:
            self.loop.remove_reader(self.engine.fileno())
        streams, self._streams = self._streams, {}
        for rid, stream in streams.items():
            stream.push(EndedEvent(rid, STATUS_ERROR, error))

    async def close(self, grace: float = 10.0) -> None:
        """Close the engine once no other thread uses it (the worker: ask it to exit)."""
        def unused():
            with self._lease_lock:
                self._lease_lock.wait_for(lambda: self._leases == 0)
        await self.loop.run_in_executor(None, unused)
        await self.engine.aclose(grace)

    def check_open(self) -> None:
        if self.closing:
            raise EngineError(ErrorCode.UNLOADED, "the model was unloaded")


def refused(verdict: int, error: str | None) -> EngineError:
    if verdict == SUBMIT_OVER_SHARE:
        return EngineError(ErrorCode.OVER_SHARE, "this API key already holds its share of the "
                           "model's queue (inference.limits.key_share); retry when some of its "
                           "requests finish")
    if verdict == SUBMIT_QUEUE_FULL:
        return EngineError(ErrorCode.QUEUE_FULL, "the model's request queue is full; retry shortly")
    return EngineError(ErrorCode.INVALID_GRAMMAR, f"the response format's grammar was refused: {error}")
