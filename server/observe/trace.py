"""POST /v1/debug/trace: record what the engines do for a few seconds, answer with Chrome
trace event JSON (`{"traceEvents": [...]}`) that Perfetto and chrome://tracing open.

Each model is a process: a worker's own pid, or 1, 2 ... for engines in the daemon. Its track 0
holds the engine's steps, each with its phases (schedule, batch, decode, sample, emit) nested
inside; every request has its own track (its id + 1) with one `request` span (submitted to
finished) holding `queued`, its `prefill` chunks, `decode` and a `finish` mark. Requests that
finish within the window are there in full (from their submission, which may precede it); a
prefill chunk of one still running at the end appears alone; a step that runs when the
recording starts is there whole.

One clock for every process: the engine stamps its records with std::chrono::steady_clock,
which libstdc++ reads from clock_gettime(CLOCK_MONOTONIC) on Linux. CLOCK_MONOTONIC is the
machine's one clock since boot, the same in every process (unlike the CPU-time clocks), so a
worker's microseconds, an inline engine's and the daemon's time.monotonic_ns() lie on one axis
with no offset to estimate: the records are merged as they come, and `otherData.window_us` (the
daemon's reading when the recording started and when the last engine had stopped) brackets them.

A recording of 60 s is megabytes: the records are decoded, turned into events and encoded a
chunk at a time (wire.TRACE_CHUNK records), letting the loop turn between chunks, and the
answer is streamed part by part.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import time

import orjson

from ..errors import Code, DomainError, invalid
from ..engine.errors import EngineError
from ..engine.core import FINISH_REASONS
from ..engine.wire import WireError

MIN_SECONDS, MAX_SECONDS = 1, 60
STEP_TRACK = 0

_recording: set[int] = set()        # id() of the owners (a node's cluster context) with a trace running


def seconds_of(body: dict) -> float:
    value = body.get("seconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'seconds' is required: a number from {MIN_SECONDS} to {MAX_SECONDS}", "seconds")
    if not MIN_SECONDS <= value <= MAX_SECONDS:       # also false for NaN
        raise invalid(f"'seconds' must be between {MIN_SECONDS} and {MAX_SECONDS}, got {value}", "seconds")
    return float(value)


def now_us() -> int:
    return time.monotonic_ns() // 1000             # CLOCK_MONOTONIC, as the engines' stamps


async def record(owner, engines: dict, seconds: float, reply_timeout: float) -> "ChromeTrace":
    """engines: model id -> engine client (inline or worker). One recording per owner (a node)
    at a time (409 otherwise). A worker that dies (or does not answer within `reply_timeout`) costs only
    its own records: the trace names it in `otherData.lost`."""
    if id(owner) in _recording:
        raise DomainError(Code.TAKEN, "a trace is already being recorded on this node; "
                       "retry when it has finished")
    _recording.add(id(owner))
    trace = ChromeTrace()
    try:
        t_start = now_us()
        started = await _start(engines, trace, reply_timeout)
        try:
            await asyncio.sleep(seconds)
        finally:
            await asyncio.gather(*(_collect(trace, model_id, engine, reply_timeout)
                                   for model_id, engine in started.items()))
        trace.other.update(seconds=seconds, window_us=[t_start, now_us()])
    finally:
        _recording.discard(id(owner))
    return trace


async def _start(engines: dict, trace: "ChromeTrace", reply_timeout: float) -> dict:
    """Start every engine's recording at once; those that answer are traced."""
    async def start(model_id, engine) -> bool:
        try:
            if await asyncio.wait_for(engine.trace_start(), reply_timeout):
                return True
            # Only this module starts recordings, one trace per node at a time: a recording
            # already on was left by a trace whose stop never reached the engine (a worker
            # that answered after reply_timeout). Its records are stale: drop them, start anew.
            await _collect(None, model_id, engine, reply_timeout)
            if await asyncio.wait_for(engine.trace_start(), reply_timeout):
                return True
            trace.lost[model_id] = "its engine is recording already"
        except (EngineError, asyncio.TimeoutError) as exc:
            trace.lost[model_id] = _why(exc, reply_timeout)
        return False
    answers = await asyncio.gather(*(start(m, e) for m, e in engines.items()))
    return {m: e for (m, e), ok in zip(engines.items(), answers) if ok}


async def _collect(trace: "ChromeTrace | None", model_id: str, engine, reply_timeout: float) -> None:
    """Stop one engine's recording and add its records to `trace` (None: discard them)."""
    try:
        chunks, n_dropped = await asyncio.wait_for(engine.trace_stop(), reply_timeout)
        pid = trace.process(model_id, engine.pid) if trace is not None else 0
        while True:
            with collector_held():
                records = next(chunks, None)
                if records is None:
                    break
                if trace is not None:
                    trace.add(pid, records)
            await asyncio.sleep(0)       # let the loop turn between chunks
    except (EngineError, WireError, asyncio.TimeoutError, KeyError, TypeError, IndexError) as exc:
        if trace is not None:
            trace.lost[model_id] = _why(exc, reply_timeout)
        return
    if trace is not None and n_dropped:
        trace.other.setdefault("dropped_records", {})[model_id] = n_dropped


@contextlib.contextmanager
def collector_held():
    """Python's cyclic collector held off while one chunk is decoded and converted. Its
    records and events are acyclic, freed by reference counting when the chunk is done; left
    on, the collector would promote them (alive while the chunk is built) and then run full
    collections of the daemon's whole heap, tens of milliseconds each, several per trace."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _why(exc: Exception, reply_timeout: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"its worker did not answer within {reply_timeout:g} s (debug.trace_reply_timeout)"
    if isinstance(exc, (KeyError, TypeError, IndexError)):
        return f"its worker sent a trace record of the wrong shape ({exc!r})"
    return str(exc)


class ChromeTrace:
    """Chrome trace events, gathered model by model, chunk by chunk: each chunk's events are
    encoded as they are made, so a long recording is held as bytes, not as millions of dicts."""

    def __init__(self):
        self.parts: list[bytes] = []               # encoded events, comma-joined at the end
        self.models: dict[str, int] = {}           # model id -> its pid in the trace
        self.lost: dict[str, str] = {}             # model id -> why its records are missing
        self.other: dict = {"clock": "CLOCK_MONOTONIC, microseconds"}
        self.n_inline = 0

    def process(self, model_id: str, os_pid: int | None) -> int:
        """A model's process in the trace: its worker's pid, or for an engine in the daemon a
        small number of its own (1, 2 ...: no worker has those)."""
        if os_pid is None:
            self.n_inline += 1
        pid = os_pid or self.n_inline
        self.models[model_id] = pid
        self._append([_meta("process_name", pid, 0, f"model {model_id}"),
                      _meta("thread_name", pid, STEP_TRACK, "engine steps")])
        return pid

    def add(self, pid: int, records: list[dict]) -> None:
        events = []
        for r in records:
            if r["kind"] == "step":
                events += _step(pid, r)
            elif r["kind"] == "prefill":
                events.append(_span("prefill", pid, _track(r), r["t_begin_us"], r["t_end_us"],
                                    {"n_tokens": r["n_tokens"]}))
            else:
                events.append(_meta("thread_name", pid, _track(r), f"request {r['id_request']}"))
                events += _request(pid, r)
        self._append(events)

    def _append(self, events: list[dict]) -> None:
        if events:
            encoded = orjson.dumps(events)
            self.parts.append(b"," + encoded[1:-1] if self.parts else encoded[1:-1])

    async def stream(self):
        """The JSON document, part by part: the HTTP layer sends each as it is taken (and waits
        while the client is slow), so a long recording never becomes one large write."""
        yield b'{"traceEvents":['
        for part in self.parts:
            yield part
            await asyncio.sleep(0)       # a turn of the loop between two writes
        other = {**self.other, "models": list(self.models), "lost": self.lost}
        yield b'],"displayTimeUnit":"ms","otherData":' + orjson.dumps(other) + b"}"


def _track(r: dict) -> int:
    return r["id_request"] + 1          # track 0 is the steps'


def _meta(name: str, pid: int, tid: int, value: str) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}


def _span(name: str, pid: int, tid: int, begin: int, end: int, args: dict | None = None) -> dict:
    event = {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": begin, "dur": max(end - begin, 0)}
    if args:
        event["args"] = args
    return event


def _step(pid: int, r: dict) -> list[dict]:
    out = [_span("step", pid, STEP_TRACK, r["t_begin_us"], r["t_end_us"],
                 {"n_items": r["n_items"], "n_tokens": r["n_tokens"], "n_sampled": r["n_sampled"]})]
    t = r["t_begin_us"]
    for phase, duration in r["phase_us"].items():
        out.append(_span(phase, pid, STEP_TRACK, t, t + duration))
        t += duration
    return out


def _request(pid: int, r: dict) -> list[dict]:
    tid = _track(r)
    submitted, admitted, first, finished = r["t_begin_us"], r["t_admit_us"], r["t_first_us"], r["t_end_us"]
    out = [_span("request", pid, tid, submitted, finished, {
        "id_request": r["id_request"], "n_prompt": r["n_prompt"], "n_cached": r["n_cached"],
        "n_generated": r["n_tokens"], "finish_reason": FINISH_REASONS[r["status"]]})]
    if admitted:
        out.append(_span("queued", pid, tid, submitted, admitted))
    if first:
        out.append(_span("decode", pid, tid, first, finished, {"n_generated": r["n_tokens"]}))
    out.append({"name": "finish", "ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": finished,
                "args": {"finish_reason": FINISH_REASONS[r["status"]]}})
    return out
