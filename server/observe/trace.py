"""POST /v1/debug/trace: record what the engines do for a few seconds, answer with Chrome
trace event JSON (`{"traceEvents": [...]}`) that Perfetto and chrome://tracing open.

Each model is a process (pid). Its track 0 holds the engine's steps, each with its phases
(schedule, batch, decode, sample, emit) nested inside; every request has its own track
with one `request` span (submitted to finished) holding `queued`, its `prefill` chunks,
`decode` and a `finish` mark. Requests that finish within the window are there in full;
a prefill chunk of one still running at the end appears alone.
"""
from __future__ import annotations

import asyncio

from ..http.errors import ApiError, ErrorKind, invalid
from ..engine.native import FINISH_REASONS

MIN_SECONDS, MAX_SECONDS = 1, 60
STEP_TRACK = 0

_recording: set[int] = set()        # id() of the nodes with a trace running


def seconds_of(body: dict) -> float:
    value = body.get("seconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'seconds' is required: a number from {MIN_SECONDS} to {MAX_SECONDS}", "seconds")
    if not MIN_SECONDS <= value <= MAX_SECONDS:       # also false for NaN
        raise invalid(f"'seconds' must be between {MIN_SECONDS} and {MAX_SECONDS}, got {value}", "seconds")
    return float(value)


async def record(node, engines: dict, seconds: float) -> dict:
    """engines: model id -> Engine. One recording per node at a time (409 otherwise)."""
    if id(node) in _recording:
        raise ApiError(ErrorKind.CONFLICT, "a trace is already being recorded on this node; "
                       "retry when it has finished")
    _recording.add(id(node))
    started = {}
    # An engine in a worker process does not record yet: only inline engines
    # (engine.isolation = "inline", the profiling setting) are traced.
    not_traced = [model_id for model_id, engine in engines.items() if not hasattr(engine, "trace_start")]
    try:
        for model_id, engine in engines.items():
            if model_id in not_traced:
                continue
            if not engine.trace_start():
                raise ApiError(ErrorKind.CONFLICT, f"the engine of '{model_id}' is already tracing")
            started[model_id] = engine
        await asyncio.sleep(seconds)
    finally:
        records = {model_id: engine.trace_stop() for model_id, engine in started.items()}
        _recording.discard(id(node))
    trace = chrome_trace(records, seconds)
    trace["otherData"]["not_traced"] = not_traced
    return trace


def chrome_trace(records: dict[str, list[dict]], seconds: float) -> dict:
    events = []
    for pid, (model_id, model_records) in enumerate(records.items(), start=1):
        events.append(_meta("process_name", pid, 0, f"model {model_id}"))
        events.append(_meta("thread_name", pid, STEP_TRACK, "engine steps"))
        for r in model_records:
            if r["kind"] == "step":
                events += _step(pid, r)
            elif r["kind"] == "prefill":
                events.append(_span("prefill", pid, _track(r), r["t_begin_us"], r["t_end_us"],
                                    {"n_tokens": r["n_tokens"]}))
            else:
                events.append(_meta("thread_name", pid, _track(r), f"request {r['id_request']}"))
                events += _request(pid, r)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"seconds": seconds, "models": list(records), "clock": "steady, microseconds"}}


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
