"""The stub (server/_engine.pyi) against the compiled module: the counter list and the event's
fields have one source of truth in C++, and the stub must say the same."""
import ast
import os

import pytest

from stackd.engine import core as native
from stackd.engine.core import STATUS_ERROR, STATUS_RUNNING, Event

STUB = os.path.join(os.path.dirname(native.__file__), "..", "_engine.pyi")


def stub_fields(class_name: str) -> list[str]:
    tree = ast.parse(open(STUB).read())
    [node] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign)]


def test_stub_counters_are_the_native_list():
    assert stub_fields("EngineStats") == [field for field, _, _, _ in native.COUNTERS]


def test_counter_names_are_prometheus_names():
    for field, name, labels, help_text in native.COUNTERS:
        assert name.replace("_", "").isalnum() and name.islower(), name
        assert help_text.endswith("."), field
        assert labels == "" or labels.count('="') == 1, labels


def test_stub_event_fields_are_the_native_fields():
    native_fields = {name for name in dir(Event) if not name.startswith("_")}
    assert set(stub_fields("Event")) == native_fields


def test_events_made_in_python_read_by_name():
    event = Event(id_request=7, status=STATUS_ERROR, error="the model was unloaded")
    assert (event.id_request, event.status, event.text, event.error) == (7, STATUS_ERROR, b"",
                                                                          "the model was unloaded")
    assert event.logprobs is None and event.embedding is None
    assert Event(id_request=1).status == STATUS_RUNNING and Event(id_request=1).error is None
    with pytest.raises(AttributeError):
        event.status = STATUS_RUNNING                   # read-only
    with pytest.raises(ValueError):
        Event(id_request=1, status=99)


def test_an_event_crosses_the_worker_wire_by_name():
    import numpy as np

    from stackd.engine import wire

    logprobs = [(5, -0.25, b"hi", [(5, -0.25, b"hi"), (7, -1.5, b"\xff")])]
    sent = [Event(id_request=3, status=STATUS_RUNNING, text=b"caf\xc3\xa9", n_tokens=1, n_prompt=4,
                  n_cached=2, n_generated=1, logprobs=logprobs),
            Event(id_request=4, status=STATUS_ERROR, error="boom", embedding=np.arange(6, dtype=np.float32),
                  timings=native.Timings(t_queue_us=1, t_prompt_us=2, t_first_token_us=3, t_predicted_us=4),
                  stop="</end>")]
    [(header, got_tail)] = wire.FrameReader().feed(wire.frame({"op": "events"}, native.encode_events_wire(sent)))
    got = wire.decode_events(got_tail)
    for a, b in zip(sent, got):
        for name in ("id_request", "status", "text", "n_tokens", "n_prompt", "n_cached", "n_generated",
                     "logprobs", "error", "stop"):
            assert getattr(a, name) == getattr(b, name), name
    assert got[0].stop is None and got[1].stop == "</end>"
    assert got[1].embedding.tolist() == list(range(6)) and got[0].embedding is None
    assert got[0].timings is None and got[1].timings.t_predicted_us == 4


def test_every_byte_and_shape_of_an_event_survives_the_wire():
    import numpy as np

    from stackd.engine import wire

    alts = [(t, -float(t) / 7, bytes([t % 256]) * (t % 5)) for t in range(300)]
    sent = [Event(id_request=2**62, status=STATUS_RUNNING, text=bytes(range(256)), n_tokens=2**31 - 1,
                  n_prompt=-1, logprobs=[(1, float("-1e-30"), b"", alts), (2, -3.5, b"\x00\xff", [])]),
            Event(id_request=-5, status=STATUS_ERROR, error="caf\u00e9 \u2603 \"quoted\" \\ \n",
                  embedding=np.array([np.inf, -0.0, 1e-45, 3.4e38], dtype=np.float32))]
    got = wire.decode_events(native.encode_events_wire(sent))
    assert len(got) == 2
    for a, b in zip(sent, got):
        for name in ("id_request", "status", "text", "n_tokens", "n_prompt", "n_cached", "n_generated",
                     "logprobs", "error", "timings"):
            assert getattr(a, name) == getattr(b, name), name
    assert np.array_equal(got[1].embedding, sent[1].embedding)


def test_a_broken_event_wire_is_a_wire_error_never_a_crash():
    from stackd.engine import wire

    good = native.encode_events_wire([Event(id_request=1, text=b"abc", error="e",
                                            logprobs=[(1, -1.0, b"x", [(2, -2.0, b"y")])])])
    for cut in range(1, len(good)):                  # every truncation
        with pytest.raises(wire.WireError):
            wire.decode_events(good[:cut])
    forged = bytearray(good)
    forged[12:16] = (99).to_bytes(4, "little")       # an unknown status
    with pytest.raises(wire.WireError):
        wire.decode_events(bytes(forged))
    huge = bytearray(good)
    huge[28:32] = (2**32 - 1).to_bytes(4, "little")  # the text length, far past the end
    with pytest.raises(wire.WireError):
        wire.decode_events(bytes(huge))
    assert wire.decode_events(b"") == []


def test_stub_histograms_and_gauges_are_the_native_lists():
    assert stub_fields("EngineHistograms") == [field for field, _, _ in native.HISTOGRAMS]
    assert stub_fields("EngineGauges") == [field for field, _, _ in native.GAUGES]
    assert set(stub_fields("Timings")) == {n for n in dir(native.Timings) if not n.startswith("_")}
