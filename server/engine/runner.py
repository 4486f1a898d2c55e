"""One loaded model on the event loop's side: submit work, receive events.

The engine's thread signals an eventfd after each step; the loop watches it with
add_reader (no polling, no thread hop through call_soon_threadsafe) and hands each
event to the stream of the request it belongs to.
"""
from __future__ import annotations

import asyncio
import collections
import itertools

from ..http.errors import ApiError, ErrorKind
from . import FINISH_REASONS, STATUS_ERROR, STATUS_RUNNING, Engine, SamplingParams

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
        loop.add_reader(engine.fileno(), self._on_events)

    def generate(self, jobs: list[tuple[list[int], int, SamplingParams]],
                 stop: list[str]) -> Generation:
        """Submit one engine request per (prompt, max_tokens, sampling) job; job i is choice i."""
        self.check_open()
        stream = Generation(self.loop)
        for index, (prompt, max_tokens, sampling) in enumerate(jobs):
            id_request = next(self._ids)
            try:
                accepted = self.engine.submit(id_request, prompt, max_tokens, stop, sampling)
            except ValueError as exc:
                self.cancel(stream)
                raise ApiError(ErrorKind.INVALID_REQUEST, str(exc), param="response_format") from None
            if not accepted:
                self.cancel(stream)
                raise busy()
            stream.choice[id_request] = index
            stream.n_open += 1
            self._streams[id_request] = stream
        return stream

    def embed(self, inputs: list[list[int]]) -> Generation:
        self.check_open()
        id_request = next(self._ids)
        stream = Generation(self.loop)
        if not self.engine.submit_embedding(id_request, inputs):
            raise busy()
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
        self.closing = True
        self.loop.remove_reader(self.engine.fileno())
        streams, self._streams = self._streams, {}
        for id_request, stream in streams.items():
            stream.push((id_request, b"", 0, STATUS_ERROR, 0, 0, 0, None, None, reason))

    def close_engine(self) -> None:
        """Join the engine's thread and free the model (blocking: call from a worker thread)."""
        self.engine.close()


    def check_open(self) -> None:
        if self.closing:
            raise unloaded()


def unloaded() -> ApiError:
    return ApiError(ErrorKind.UNAVAILABLE, "the model was unloaded", headers=((b"retry-after", b"1"),))


def busy() -> ApiError:
    return ApiError(ErrorKind.UNAVAILABLE, "the model's request queue is full; retry shortly",
                    headers=((b"retry-after", b"1"),))
