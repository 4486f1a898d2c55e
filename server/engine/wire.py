"""Framed messages between the daemon and an engine worker process.

A frame is `<u32 body length><u32 header length><header: JSON object><tail: raw bytes>`. The
header names its message (`op`) and its fields; the tail carries what JSON would bloat (the
float32 vectors of embedding results). Bytes fields (generated text, token pieces) travel as
latin-1 strings, which map every byte to one code point and back.

Nothing here executes what it decodes: the worker runs llama.cpp on files that came from a
registry, so the daemon treats what it sends as data of a fixed shape (no pickle).
"""
from __future__ import annotations

import struct
from typing import Iterator

import orjson

HEADER = struct.Struct("<II")
MAX_FRAME = 256 << 20              # a 2,048-input embedding result is ~3 MiB; a prompt ~1 MiB


class WireError(ValueError):
    """A frame that breaks the format: the other side is not speaking it (or is broken)."""


def frame(message: dict, tail: bytes = b"") -> bytes:
    head = orjson.dumps(message)
    return HEADER.pack(len(head) + len(tail), len(head)) + head + tail


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
            try:
                header = orjson.loads(bytes(buf[start:start + n_head]))
            except orjson.JSONDecodeError as exc:
                raise WireError(f"bad frame header: {exc}") from None
            if not isinstance(header, dict):
                raise WireError("frame header is not an object")
            with memoryview(buf) as view:          # one copy of a tail, not two (a trace is MBs)
                frames.append((header, view[start + n_head:end].tobytes()))
            at = end
        del buf[:at]
        return frames


def text(data: bytes) -> str:
    return data.decode("latin-1")


def data(text_: str) -> bytes:
    return text_.encode("latin-1")


# ---- engine events ---------------------------------------------------------------------------
# An event crosses as an object with the Event's field names (text latin-1, the embedding as
# its number of floats, n_embedding); embedding vectors follow in the tail, in event order.

EVENT_FIELDS = ("id_request", "n_tokens", "status", "n_prompt", "n_cached", "n_generated")
TIMINGS_FIELDS = ("t_queue_us", "t_prompt_us", "t_first_token_us", "t_predicted_us")

def _logprobs_out(entries):
    if not entries:
        return None
    return [[token, logprob, text(piece), [[t, lp, text(p)] for t, lp, p in top]]
            for token, logprob, piece, top in entries]


def _logprobs_in(entries):
    if not entries:
        return None
    return [(token, logprob, data(piece), [(t, lp, data(p)) for t, lp, p in top])
            for token, logprob, piece, top in entries]


def encode_events(events) -> tuple[list, bytes]:
    items, vectors = [], []
    for ev in events:
        embedding = ev.embedding
        n_floats = 0
        if embedding is not None:
            raw = embedding.astype("<f4", copy=False).tobytes()
            vectors.append(raw)
            n_floats = len(raw) // 4
        item = {name: getattr(ev, name) for name in EVENT_FIELDS}
        timings = ev.timings
        item.update(text=text(ev.text), logprobs=_logprobs_out(ev.logprobs), n_embedding=n_floats,
                    error=ev.error or "",
                    timings=None if timings is None else {n: getattr(timings, n) for n in TIMINGS_FIELDS})
        items.append(item)
    return items, b"".join(vectors)


def decode_events(items: list, tail: bytes) -> list:
    from .native import Event, Timings

    events, at = [], 0
    for item in items:
        if not isinstance(item, dict) or not all(isinstance(item.get(name), int) for name in EVENT_FIELDS):
            raise WireError("bad event")
        n_floats = item.get("n_embedding", 0)
        embedding = None
        if n_floats:                        # numpy only where vectors come: a chat-only
            import numpy as np              # daemon never loads it (~10 MB of its memory)
            embedding = np.frombuffer(tail, dtype="<f4", count=n_floats, offset=at)
            at += 4 * n_floats
        try:
            events.append(Event(**{name: item[name] for name in EVENT_FIELDS}, text=data(item["text"]),
                                error=item["error"], logprobs=_logprobs_in(item["logprobs"]),
                                embedding=embedding,
                                timings=None if item.get("timings") is None else Timings(**item["timings"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"bad event: {exc}") from None
    return events


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
        chunk = orjson.dumps(batch)
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
            records = orjson.loads(view[at:at + n])
        except orjson.JSONDecodeError as exc:
            raise WireError(f"bad trace chunk: {exc}") from None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise WireError("bad trace chunk: not a list of records")
        at += n
        yield records
