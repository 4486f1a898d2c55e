"""One loaded model on the event loop's side: submit work, receive events.

The engine's thread signals an eventfd after each step; the loop watches it with
add_reader (no polling, no thread hop through call_soon_threadsafe) and hands each
event to the stream of the request it belongs to.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading

from ..http.errors import ApiError, ErrorKind
from .native import (FINISH_REASONS, STATUS_ERROR, STATUS_RUNNING, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE,
                     Engine, SamplingParams)

# Event tuple fields (see server/_engine.pyi)
EV_ID, EV_TEXT, EV_TOKENS, EV_STATUS, EV_PROMPT, EV_CACHED, EV_GENERATED, EV_LOGPROBS, EV_EMBEDDING, EV_ERROR = range(10)


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
        if event[EV_STATUS] != STATUS_RUNNING:
            self.n_open -= 1
        return event


def finish_reason(status: int) -> str | None:
    return FINISH_REASONS[status]


class ModelRunner:
    def __init__(self, loop: asyncio.AbstractEventLoop, engine: Engine):
        self.loop = loop
        self.engine = engine
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
                raise unloaded()
            self._leases += 1
        try:
            yield self.engine
        finally:
            with self._lease_lock:
                self._leases -= 1
                self._lease_lock.notify_all()

    def generate(self, jobs: list[tuple[list[int], int, SamplingParams]],
                 stop: list[str], owner: int = 0) -> Generation:
        """Submit one engine request per (prompt, max_tokens, sampling) job; job i is choice i.
        `owner` (the API key) is the unit of the fair share of slots and queue."""
        self.check_open()
        stream = Generation(self.loop)
        for index, (prompt, max_tokens, sampling) in enumerate(jobs):
            id_request = next(self._ids)
            try:
                verdict = self.engine.submit(id_request, prompt, max_tokens, stop, sampling, owner)
            except ValueError as exc:
                self.cancel(stream)
                raise ApiError(ErrorKind.INVALID_REQUEST, str(exc), param="response_format") from None
            if verdict != SUBMIT_ACCEPTED:
                self.cancel(stream)
                raise refused(verdict)
            stream.choice[id_request] = index
            stream.n_open += 1
            self._streams[id_request] = stream
        return stream

    def embed(self, inputs: list[list[int]], owner: int = 0) -> Generation:
        self.check_open()
        id_request = next(self._ids)
        stream = Generation(self.loop)
        verdict = self.engine.submit_embedding(id_request, inputs, owner)
        if verdict != SUBMIT_ACCEPTED:
            raise refused(verdict)
        stream.choice[id_request] = 0
        stream.n_open = 1
        self._streams[id_request] = stream
        return stream

    def cancel(self, stream: Generation) -> None:
        """The client went away (or the request failed): free the slots at the next step."""
        for id_request in stream.choice:
            if self._streams.pop(id_request, None) is not None:
                self.engine.cancel(id_request)

    def _on_events(self) -> None:
        streams = self._streams
        for event in self.engine.take_events():
            stream = streams.get(event[EV_ID])
            if stream is None:
                continue                   # cancelled already
            if event[EV_STATUS] != STATUS_RUNNING:
                del streams[event[EV_ID]]
            stream.push(event)

    def end_all(self, reason: str) -> None:
        """Finish every open request with an error event (on the loop thread), and stop
        listening to the engine: used when the model is unloaded under its requests."""
        with self._lease_lock:
            self.closing = True
        self.loop.remove_reader(self.engine.fileno())
        streams, self._streams = self._streams, {}
        for id_request, stream in streams.items():
            stream.push((id_request, b"", 0, STATUS_ERROR, 0, 0, 0, None, None, reason))

    def close_engine(self) -> None:
        """Join the engine's thread and free the model (blocking: call from a worker thread),
        once no other thread is using it."""
        with self._lease_lock:
            self._lease_lock.wait_for(lambda: self._leases == 0)
        self.engine.close()


    def check_open(self) -> None:
        if self.closing:
            raise unloaded()


def unloaded() -> ApiError:
    return ApiError(ErrorKind.UNAVAILABLE, "the model was unloaded", headers=((b"retry-after", b"1"),))


def refused(verdict: int) -> ApiError:
    if verdict == SUBMIT_OVER_SHARE:
        return ApiError(ErrorKind.RATE_LIMIT, "this API key already holds its share of the model's "
                        "queue (inference.limits.key_share); retry when some of its requests finish",
                        headers=((b"retry-after", b"1"),))
    return busy()


def busy() -> ApiError:
    return ApiError(ErrorKind.UNAVAILABLE, "the model's request queue is full; retry shortly",
                    headers=((b"retry-after", b"1"),))
