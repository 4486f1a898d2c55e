"""An engine worker writes its frames with the standard library's json, the daemon with orjson:
the two must write documents each other reads to the same values (wire.py)."""
import json
import math
import os
import random
import subprocess
import sys

import orjson
import pytest

from stackd.engine import wire

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "text", "none", "bool", "special"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-(1 << 63), (1 << 63) - 1)
    if kind == "float":
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 10 ** rng.randint(-300, 300), -0.0, 5e-324])
    if kind == "text":                     # latin-1 text, as bytes fields cross
        return bytes(rng.randrange(256) for _ in range(rng.randrange(12))).decode("latin-1")
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "special":
        return rng.choice([math.nan, math.inf, -math.inf])
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randrange(5))}


def orjson_reads(value):
    """What the daemon reads from orjson's own encoding of `value` (NaN and infinities: null)."""
    return orjson.loads(orjson.dumps(value))


def test_standard_json_frames_read_as_orjson_frames_do():
    rng = random.Random(11)
    for _ in range(3000):
        message = {"op": "events", "value": random_value(rng)}
        expected = orjson_reads(message)
        assert orjson.loads(wire.standard_dumps(message)) == expected
        assert wire.standard_loads(orjson.dumps(message)) == expected


def test_a_frame_reader_reads_either_codec():
    message = {"op": "stats", "stats": {"n": 3, "mean": math.nan, "top": -math.inf}, "text": "\x00\xff\n"}
    tail = b"\x01\x02"
    for encoded in (wire.frame(message, tail), _standard_frame(message, tail)):
        [(header, got_tail)] = wire.FrameReader().feed(encoded)
        assert header == {"op": "stats", "stats": {"n": 3, "mean": None, "top": None}, "text": "\x00\xff\n"}
        assert got_tail == tail


def _standard_frame(message, tail):
    head = wire.standard_dumps(message)
    return wire.HEADER.pack(len(head) + len(tail), len(head)) + head + tail


def test_a_broken_header_is_a_wire_error_with_either_codec():
    broken = b"{nope"
    framed = wire.HEADER.pack(len(broken), len(broken)) + broken
    with pytest.raises(wire.WireError):
        wire.FrameReader().feed(framed)
    code = ("import sys\nfrom stackd.engine import wire\nwire.use_standard_json()\n"
            f"try:\n    wire.FrameReader().feed({framed!r})\nexcept wire.WireError:\n    print('wire error')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "wire error"


def test_a_worker_process_never_imports_orjson():
    """The worker's imports (server/engine/worker.py main) with its codec: orjson is never
    loaded, nor what importing it brings (dataclasses, inspect, uuid, datetime), nor the socket
    module (the worker uses the C type it wraps)."""
    code = ("import json, sys\n"
            "from stackd.engine import accel, core, worker, wire\n"
            "from stackd.system import memory\n"
            "wire.use_standard_json()\n"
            "[(header, _)] = wire.FrameReader().feed(wire.frame({'op': 'ready', 'x': [1.5, float('nan')]}))\n"
            "wire.encode_trace([{'t': 1}])\n"
            "loaded = sorted(set(sys.modules) & {'dataclasses', 'inspect', 'uuid', 'datetime', 'typing', 'socket'})\n"
            "print(json.dumps([header, loaded, 'orjson.orjson' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [{"op": "ready", "x": [1.5, None]}, [], False]
