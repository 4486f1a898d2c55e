"""server/observe/trace.py's gathering, over hand-made engines (no model): a recording left on
by an earlier trace is dropped and started anew, a worker's malformed records cost only that
model, the chunked encoding is the document whole, and the records cross the wire intact."""
import asyncio

import orjson
import pytest

from stackd.engine import wire
from stackd.observe import trace

STEP = {"kind": "step", "t_begin_us": 10, "t_end_us": 25, "n_items": 1, "n_tokens": 1, "n_sampled": 1,
        "phase_us": {"schedule": 1, "batch": 2, "decode": 10, "sample": 1, "emit": 1}}


class FakeEngine:
    """Answers like a client: trace_start -> bool, trace_stop -> (chunks, n_dropped)."""

    def __init__(self, pid, recording=False, records=(STEP,), stale=False):
        self.pid, self.recording, self.records, self.stale = pid, recording, list(records), stale
        self.stops = 0

    async def trace_start(self) -> bool:
        if self.recording:
            return False
        self.recording = True
        return True

    async def trace_stop(self):
        self.recording = False
        self.stops += 1
        records = [{**STEP, "t_begin_us": 1}] if self.stops == 1 and self.stale else self.records
        return iter([records]), 0


async def document(recorded: trace.ChromeTrace) -> dict:
    return orjson.loads(b"".join([part async for part in recorded.stream()]))


def run(engines: dict) -> dict:
    async def record():
        return await document(await trace.record(object(), engines, 1, reply_timeout=5))
    return asyncio.run(record())


def test_a_stale_recording_is_dropped_and_started_anew():
    stale = FakeEngine(4242, recording=True, stale=True)
    body = run({"m": stale})
    assert body["otherData"]["lost"] == {} and stale.stops == 2
    steps = [e for e in body["traceEvents"] if e["name"] == "step"]
    assert [e["ts"] for e in steps] == [STEP["t_begin_us"]] and steps[0]["pid"] == 4242


def test_malformed_records_cost_only_their_model():
    good, bad = FakeEngine(None), FakeEngine(7, records=[{"kind": "step"}])
    body = run({"good": good, "bad": bad})
    assert "wrong shape" in body["otherData"]["lost"]["bad"]
    assert [e["pid"] for e in body["traceEvents"] if e["name"] == "step"] == [1]   # the inline one


def test_the_chunked_encoding_is_the_whole_document():
    t = trace.ChromeTrace()
    pid = t.process("m", 99)
    t.add(pid, [STEP] * 3)
    t.add(pid, [])
    t.add(pid, [{**STEP, "t_begin_us": 100}])
    body = asyncio.run(document(t))
    assert [e["name"] for e in body["traceEvents"]] == ["process_name", "thread_name"] + \
        ["step", "schedule", "batch", "decode", "sample", "emit"] * 4
    assert body["traceEvents"][-6]["ts"] == 100 and body["otherData"]["models"] == ["m"]


@pytest.mark.parametrize("n", [0, 1, wire.TRACE_CHUNK, 2 * wire.TRACE_CHUNK + 5])
def test_records_cross_the_wire_intact(n):
    records = [{**STEP, "t_begin_us": i} for i in range(n)]
    sizes, n_dropped, tail = wire.encode_trace(records)
    [(header, got_tail)] = wire.FrameReader().feed(wire.frame({"op": "trace", "chunks": sizes}, tail))
    assert n_dropped == 0 and [r for chunk in wire.decode_trace(header["chunks"], got_tail) for r in chunk] == records


@pytest.mark.parametrize("sizes, tail", [([3], b"[]"), ([2], b"{}"), ([2], b"[x"), ("2", b"[]")])
def test_a_bad_trace_tail_is_a_wire_error(sizes, tail):
    with pytest.raises(wire.WireError):
        list(wire.decode_trace(sizes, tail))
