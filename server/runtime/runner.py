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
from ..engine.submission import TextJobs
from ..engine.submit import VERDICT_UNFIT, VERDICT_UNTOKENIZABLE, jobs_of_text
from ..system import offload

# An inline engine tokenizes texts up to this size on the loop (microseconds); longer ones (a
# 1 MiB prompt, 2,048 embedding inputs) on an offload thread, so other clients never wait.
ON_LOOP_CHARS = 16 * 1024


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


# Errors of an engine that is gone, not of the request: a request that has had no event yet is
# submitted again (Resubmitted). Refusals (queue, share) are the request's own answer.
LOST = frozenset({ErrorCode.WORKER_LOST, ErrorCode.PEER_UNREACHABLE, ErrorCode.UNLOADED,
                  ErrorCode.RESTARTING})


def lost_before_start(event) -> bool:
    error = getattr(event, "error", None)
    return event.status != STATUS_RUNNING and isinstance(error, EngineError) and error.code in LOST


class Resubmitted(Generation):
    """One API request's events from an engine that may be lost before the request's first
    event: then `resubmit()` submits its jobs again elsewhere (Routed: another replica; Held: the
    model's restarted worker) and the client sees nothing. Once an event has gone to the client
    the request stays where it is, and a loss ends it with the error event.

    A consumer that sends nothing until the end (a non-streaming answer) sets `start_over`: a
    loss at any point then submits the jobs again, and start_over() drops what it had gathered.
    """

    __slots__ = ("jobs", "stop", "owner", "inner", "started", "start_over", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop, jobs, stop, owner):
        super().__init__(loop)
        self.jobs, self.stop, self.owner = jobs, stop, owner
        self.inner: Generation | None = None
        self.started = False            # an event has gone to the client: no resubmitting from here
        self.start_over = None          # a buffering consumer's reset: resubmitting stays allowed
        self.done = False

    @property
    def finished(self) -> bool:
        return self.done

    async def __anext__(self):
        while True:
            if self.done:
                raise StopAsyncIteration
            try:
                event = await self.inner.__anext__()
            except StopAsyncIteration:
                self._end()
                raise
            if self.may_resubmit() and lost_before_start(event) and await self.resubmit(event.error):
                if self.started:
                    self.start_over()
                    self.started = False
                continue
            self.started = True
            if self.inner.finished:
                self._end()
            return event

    def may_resubmit(self) -> bool:
        return not self.started or self.start_over is not None

    def settle(self) -> None:
        """No resubmitting from now on (the model is being unloaded)."""
        self.started, self.start_over = True, None

    async def resubmit(self, error: EngineError) -> bool:
        """Submit the jobs again; True when `inner` is a new generation to read from."""
        raise NotImplementedError

    def _end(self) -> None:
        self.done = True


class Held(Resubmitted):
    """A request on a model's own worker (no replicas). Lost before its first event (the worker
    died while it waited for a slot, or before its submit was answered), it waits for the
    restarted worker, at most engine.restart_hold (registry.get's hold), and is submitted there,
    once."""

    __slots__ = ("runner", "retried")

    def __init__(self, runner: "ModelRunner", jobs, stop, owner):
        super().__init__(runner.loop, jobs, stop, owner)
        self.runner = runner
        self.retried = False

    async def start(self) -> None:
        try:
            self._use(await self.runner.submit(self.jobs, self.stop, self.owner))
        except EngineError as exc:
            if exc.code not in LOST or self.runner.restarted is None:
                raise
            await self._again()

    async def resubmit(self, error: EngineError) -> bool:
        if self.retried or self.runner.restarted is None:
            return False
        self.runner.cancel(self.inner)
        try:
            await self._again()
        except EngineError:
            return False                 # the restart did not come in time, or failed: the loss stands
        return True

    async def _again(self) -> None:
        """The jobs on the restarted worker; raises what the restart came to (503 past the hold,
        the model failed or unloaded)."""
        self.retried = True
        fresh = await self.runner.restarted()
        self.runner = fresh
        self._use(await fresh.submit(self.jobs, self.stop, self.owner))

    def _use(self, inner: Generation) -> None:
        self.inner = inner
        self.choice = inner.choice

    def cancel(self) -> None:
        if self.inner is not None:
            self.runner.cancel(self.inner)
        self.done = True


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
        # A model's own runner (not a replica's): how to reach the runner of its restarted worker
        # (registry.py sets it), for requests its worker's death caught before their first event.
        self.restarted = None
        loop.add_reader(engine.fileno(), self._on_events)

    # ---- the vocabulary ------------------------------------------------------------------------

    async def tokenize(self, texts: list[str], add_special: bool, parse_special: bool) -> list[list[int]]:
        """Each text's token ids. A worker's own vocabulary answers (the daemon keeps none); an
        engine in this process answers on the loop, or off it when the texts are long."""
        self.check_open()
        if not texts:
            return []
        if self.engine.isolation == "worker":
            return await self.engine.tokens_of(texts, add_special, parse_special)
        return await self._off_loop_if_long(sum(map(len, texts)), lambda engine: [
            engine.tokenize(text, add_special, parse_special) for text in texts])

    async def detokenize(self, tokens: list[int], special: bool = False) -> bytes:
        """The tokens' pieces, joined (ids checked against the vocabulary by the caller);
        `special`: control tokens as their text (/detokenize), else as nothing."""
        self.check_open()
        if self.engine.isolation == "worker":
            return await self.engine.text_of(tokens, special)
        return await self._off_loop_if_long(len(tokens) * 4, lambda engine: b"".join(
            engine.piece(t, special) for t in tokens))

    async def _off_loop_if_long(self, size: int, work):
        if size <= ON_LOOP_CHARS:
            return work(self.engine)

        def leased():
            with self.lease() as engine:
                return work(engine)

        return await offload.run(leased)

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
        taken or none. A model's own runner holds the request over a restart of its worker
        (Held)."""
        if self.restarted is None:
            return await self.submit(jobs, stop, owner)
        held = Held(self, jobs, stop, owner)
        await held.start()
        return held

    async def submit(self, jobs: "list[tuple[list[int], int, SamplingParams]] | TextJobs",
                     stop: list[str], owner: int = 0) -> Generation:
        """generate() on this runner's engine alone. `jobs` as TextJobs: the prompt as text,
        tokenized where the vocabulary is, in the same exchange as the submit (submission.py)."""
        self.check_open()
        stream = Generation(self.loop)
        ids = []
        for index in range(len(jobs)):
            rid = next(self._ids)
            stream.choice[rid] = index
            self._streams[rid] = stream            # events may arrive before the verdict
            ids.append(rid)
        stream.n_open = len(ids)
        if isinstance(jobs, TextJobs):
            return await self._taken(stream, self._submit_text(ids, jobs, stop, owner))
        submitted = [(rid, *job) for rid, job in zip(ids, jobs)]
        return await self._taken(stream, self.engine.submit_jobs(submitted, stop, owner))

    async def _submit_text(self, ids: list[int], text_jobs: TextJobs, stop: list[str], owner: int):
        if self.engine.isolation == "worker":
            answer = await self.engine.submit_text(ids, text_jobs, stop, owner)
        else:                                      # this process's vocabulary, off the loop when long
            made = await self._off_loop_if_long(len(text_jobs.text), lambda engine: jobs_of_text(engine, text_jobs))
            answer = await self.engine.submit_text(ids, text_jobs, stop, owner, made)
        if answer["verdict"] == VERDICT_UNFIT:
            raise EngineError(ErrorCode(answer["unfit"]), answer["error"], param=text_jobs.what)
        if answer["verdict"] == VERDICT_UNTOKENIZABLE:
            raise EngineError(ErrorCode.DECODE_FAILED,
                              f"the model's vocabulary could not tokenize: {answer['error']}")
        return answer["verdict"], answer.get("error")

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
        if isinstance(stream, Held):
            stream.cancel()              # on the runner it runs on now
            return
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


async def token_jobs(runner: "ModelRunner", text_jobs: TextJobs) -> list:
    """A TextJobs as jobs of token ids, tokenized by `runner` (for engines that take only
    tokens: a follower's replica); a prompt that does not fit raises as the worker's would."""
    tokens = []
    for text, add_special, parse_special in text_jobs.texts():
        tokens += await runner.tokenize([text], add_special, parse_special)
    made = text_jobs.jobs_from(tokens)
    if not isinstance(made[0], list):
        unfit, message = made
        raise EngineError(ErrorCode(unfit.value), message, param=text_jobs.what)
    return made[0]


def refused(verdict: int, error: str | None) -> EngineError:
    if verdict == SUBMIT_OVER_SHARE:
        return EngineError(ErrorCode.OVER_SHARE, "this API key already holds its share of the "
                           "model's queue (inference.limits.key_share); retry when some of its "
                           "requests finish")
    if verdict == SUBMIT_QUEUE_FULL:
        return EngineError(ErrorCode.QUEUE_FULL, "the model's request queue is full; retry shortly")
    return EngineError(ErrorCode.INVALID_GRAMMAR, f"the response format's grammar was refused: {error}")
