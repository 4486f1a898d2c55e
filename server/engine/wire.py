"""Framed messages between the daemon and an engine worker process.

A frame is `<u32 body length><u32 header length><header: JSON object><tail: raw bytes>`. The
header names its message (`op`) and its fields; the tail carries what JSON would bloat: engine
events in their native binary layout (native/engine/event_wire.h), trace records as JSON chunks.

Nothing here executes what it decodes: the worker runs llama.cpp on files that came from a
registry, so the daemon treats what it sends as data of a fixed shape (no pickle).
"""
from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator

# The JSON of headers and trace chunks: orjson, imported on first use, except in an engine
# worker, which switches to the standard library's json (use_standard_json) and never imports it:
# importing orjson imports dataclasses, inspect, uuid, datetime and more, ~1.3 MiB of a worker's
# memory (measured), for one small frame a decode step; and a worker runs without site-packages
# on its path (worker_boot.py). Both write the same documents, and read each other's.

HEADER = struct.Struct("<II")
MAX_FRAME = 256 << 20              # a 2,048-input embedding result is ~3 MiB; a prompt ~1 MiB


class WireError(ValueError):
    """A frame that breaks the format: the other side is not speaking it (or is broken)."""


def _use_orjson() -> None:
    global _dumps, _loads
    import orjson
    _dumps, _loads = orjson.dumps, orjson.loads


def _first_dumps(value) -> bytes:
    _use_orjson()
    return _dumps(value)


def _first_loads(data):
    _use_orjson()
    return _loads(data)


_dumps, _loads = _first_dumps, _first_loads


def standard_dumps(value) -> bytes:
    """orjson.dumps with the standard library: compact UTF-8, and NaN or an infinity as null (as
    orjson writes them; json would write `NaN`, which orjson refuses to read)."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(value), separators=(",", ":"), ensure_ascii=False)
    return text.encode()


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def standard_loads(data):
    return json.loads(bytes(data) if isinstance(data, memoryview) else data)


def use_standard_json() -> None:
    """Headers and trace chunks in this process go through the standard library's json (an
    engine worker: orjson is never imported)."""
    global _dumps, _loads
    _dumps, _loads = standard_dumps, standard_loads


def frame(message: dict, tail: bytes = b"") -> bytes:
    head = _dumps(message)
    return HEADER.pack(len(head) + len(tail), len(head)) + head + tail


EVENTS_HEAD = b'{"op":"events"}'       # what native/engine/event_wire.cpp's events_frame writes


def _parse_header(head: bytes) -> dict:
    try:
        header = _loads(head)
    except json.JSONDecodeError as exc:          # orjson's is a subclass
        raise WireError(f"bad frame header: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("frame header is not an object")
    return header


class FrameReader:
    """Accumulates received bytes and yields whole frames as (header dict, tail bytes)."""

    def __init__(self):
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[dict, bytes]]:
        buf = self.buffer
        buf += data
        frames = []
        at = 0
        while len(buf) - at >= HEADER.size:
            total, n_head = HEADER.unpack_from(buf, at)
            if total > MAX_FRAME or n_head > total:
                raise WireError(f"bad frame: {total} bytes, header {n_head}")
            end = at + HEADER.size + total
            if len(buf) < end:
                break
            start = at + HEADER.size
            head = bytes(buf[start:start + n_head])
            if head == EVENTS_HEAD:                # most frames: one a token, no parse
                header = {"op": "events"}
            else:
                header = _parse_header(head)
            with memoryview(buf) as view:          # one copy of a tail, not two (a trace is MBs)
                frames.append((header, view[start + n_head:end].tobytes()))
            at = end
        del buf[:at]
        return frames


# ---- engine events ---------------------------------------------------------------------------
# Events cross as an `events` frame whose tail is the native event wire (native/engine/
# event_wire.h): the worker's engine thread frames and sends a step's events itself (native/engine/
# frame_sink.h), the daemon's decode_events decodes them in one call, so a token costs no Python
# in the worker and one call in the daemon, not a dict per event.


def decode_events(tail: bytes) -> list:
    from .core import decode_events_wire

    try:
        return decode_events_wire(tail)
    except ValueError as exc:
        raise WireError(f"bad events: {exc}") from None


# ---- the engine trace ------------------------------------------------------------------------
# A stopped recording crosses as one `trace` frame: the records (the dicts Engine.trace_stop
# gives) as JSON arrays of at most TRACE_CHUNK records each, one after the other in the tail,
# with their byte lengths in the header. The daemon decodes them a chunk at a time between
# turns of its loop (server/observe/trace.py): a 60 s recording is megabytes.

TRACE_CHUNK = 512                      # ~80 kB of JSON: a few ms to decode, convert, encode
MAX_TRACE_TAIL = MAX_FRAME - (1 << 20) # room for the header; chunks past it are dropped


def chunks_of(records) -> Iterator[list[dict]]:
    """A stopped recording (Engine.trace_stop: TraceRecords) or a list of records, at most
    TRACE_CHUNK records at a time; a recording builds each chunk's dicts as it is taken."""
    if isinstance(records, list):
        return (records[at:at + TRACE_CHUNK] for at in range(0, len(records), TRACE_CHUNK))
    return iter(lambda: records.take(TRACE_CHUNK), [])


def encode_trace(records) -> tuple[list[int], int, bytes]:
    """(chunk lengths, records dropped to fit one frame, tail)."""
    chunks, size, at = [], 0, 0
    for batch in chunks_of(records):
        chunk = _dumps(batch)
        if size + len(chunk) > MAX_TRACE_TAIL:
            return [len(c) for c in chunks], len(records) - at, b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        at += len(batch)
    return [len(c) for c in chunks], 0, b"".join(chunks)


def decode_trace(sizes: list, tail: bytes):
    """The records, a chunk (a list of dicts) at a time."""
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes) \
            or sum(sizes) != len(tail):
        raise WireError("bad trace: chunk lengths do not match the tail")
    view, at = memoryview(tail), 0
    for n in sizes:
        try:
            records = _loads(view[at:at + n])
        except json.JSONDecodeError as exc:
            raise WireError(f"bad trace chunk: {exc}") from None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise WireError("bad trace chunk: not a list of records")
        at += n
        yield records
