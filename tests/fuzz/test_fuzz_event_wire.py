"""Fuzz: the event wire a worker process sends -> the daemon's decoder (native/engine/
event_wire.cpp). The worker runs llama.cpp on files from a registry, so the daemon trusts
nothing it sends.

Property: any bytes decode to events or raise WireError (the worker is then dropped), never
a crash, a hang or a huge allocation; and what a valid wire carried comes back unchanged.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from stackd.engine import core as native, wire

from .budget import fuzz
from .test_fuzz_gguf import mutations

pytestmark = pytest.mark.fuzz


def events():
    alt = st.tuples(st.integers(-(1 << 31), (1 << 31) - 1), st.floats(width=32, allow_nan=False),
                    st.binary(max_size=8))
    entry = st.tuples(st.integers(0, 50000), st.floats(width=32, allow_nan=False), st.binary(max_size=8),
                      st.lists(alt, max_size=4))
    one = st.builds(
        lambda rid, status, text, error, logprobs, embedding: native.Event(
            id_request=rid, status=status, text=text, error=error, logprobs=logprobs or None,
            embedding=None if embedding is None else np.array(embedding, dtype=np.float32)),
        st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, 5), st.binary(max_size=32),
        st.text(max_size=16), st.lists(entry, max_size=3),
        st.none() | st.lists(st.floats(width=32, allow_nan=False), max_size=16))
    return st.lists(one, max_size=4)


def round_trip(sent) -> None:
    got = wire.decode_events(native.encode_events_wire(sent))
    assert len(got) == len(sent)
    for a, b in zip(sent, got):
        for name in ("id_request", "status", "text", "error", "logprobs", "timings"):
            assert getattr(a, name) == getattr(b, name), name
        assert (a.embedding is None) == (b.embedding is None)


def decoded_or_refused(data: bytes) -> None:
    try:
        got = wire.decode_events(data)
    except wire.WireError:
        return
    assert isinstance(got, list)


def test_events_cross_the_wire_unchanged(fuzz_seconds):
    fuzz(events(), round_trip, seconds=fuzz_seconds / 2)


def test_mutated_wire_is_decoded_or_refused(fuzz_seconds):
    base = native.encode_events_wire([
        native.Event(id_request=7, text=b"hello", error="", logprobs=[(1, -0.5, b"he", [(2, -1.0, b"h")])]),
        native.Event(id_request=8, status=2, embedding=np.ones(8, dtype=np.float32),
                     timings=native.Timings(t_queue_us=1, t_prompt_us=2, t_first_token_us=3, t_predicted_us=4))])
    fuzz(st.one_of(mutations(base), st.binary(max_size=256)), decoded_or_refused, seconds=fuzz_seconds / 2)
