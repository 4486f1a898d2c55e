"""Fuzz: the tensor split's exchange frames (server/engine/exchange/frames.py) -> the reader a
node applies to what a peer sends. A peer is another node of the cluster, but a link may carry
anything (a bug, a cut-short write, a node that lost its way), so nothing is trusted.

Property: any bytes, in any pieces, give payloads or FrameError, never another exception, a
hang or an allocation sized by the wire; every payload given is one a valid frame carried (the
tag holds); and valid frames, however cut, come back unchanged, in order.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import strategies as st

from stackd.engine.exchange import frames

from .budget import fuzz
from .test_fuzz_gguf import mutations

pytestmark = pytest.mark.fuzz

KEY = os.urandom(32)
SENDER, STEP, LENGTH = 1, 5, 24


def sent(payloads: list[bytes]) -> bytes:
    return b"".join(frames.encode(KEY, SENDER, STEP + i, p) for i, p in enumerate(payloads))


PAYLOADS = [bytes(range(i, i + LENGTH)) for i in range(3)]
BASE = sent(PAYLOADS)


def read_or_refuse(case: tuple[bytes, list[int]]) -> None:
    """`data` fed in pieces cut at `cuts`: the payloads given are a prefix of what BASE carried."""
    data, cuts = case
    reader = frames.FrameReader(KEY, SENDER, STEP, LENGTH)
    got, at = [], 0
    try:
        for cut in sorted(set(c % (len(data) + 1) for c in cuts)) + [len(data)]:
            got += reader.feed(data[at:cut])
            at = cut
    except frames.FrameError:
        assert reader.failed
    assert got == PAYLOADS[:len(got)]
    assert len(reader.buffer) < reader.size


def in_place_or_refuse(data: bytes) -> None:
    """The all-reduce's own path: a frame-sized buffer checked in place (header, then tag)."""
    try:
        frames.check_header(data, SENDER, STEP, LENGTH)
        frames.check_tag(KEY, data[:frames.HEADER_BYTES + LENGTH + frames.TAG_BYTES])
    except frames.FrameError:
        return
    assert data.startswith(frames.encode(KEY, SENDER, STEP, PAYLOADS[0]))


def test_valid_frames_come_back_unchanged_however_cut(fuzz_seconds):
    def check(case):
        payloads, cuts = case
        reader = frames.FrameReader(KEY, SENDER, STEP, LENGTH)
        data, got, at = sent(payloads), [], 0
        for cut in sorted(set(c % (len(data) + 1) for c in cuts)) + [len(data)]:
            got += reader.feed(data[at:cut])
            at = cut
        assert got == payloads
    fuzz(st.tuples(st.lists(st.binary(min_size=LENGTH, max_size=LENGTH), max_size=4),
                   st.lists(st.integers(0, 1 << 12), max_size=6)), check, seconds=fuzz_seconds / 3)


def test_mutated_frames_are_read_or_refused(fuzz_seconds):
    fuzz(st.tuples(st.one_of(mutations(BASE), st.binary(max_size=256)), st.lists(st.integers(0, 1 << 12), max_size=6)),
         read_or_refuse, seconds=fuzz_seconds / 3)


def test_a_frame_checked_in_place_is_the_valid_one_or_refused(fuzz_seconds):
    fuzz(st.one_of(mutations(frames.encode(KEY, SENDER, STEP, PAYLOADS[0])), st.binary(max_size=128)),
         in_place_or_refuse, seconds=fuzz_seconds / 3)


def test_no_frame_may_promise_more_than_the_limit():
    with pytest.raises(frames.FrameError):
        frames.FrameReader(KEY, SENDER, STEP, frames.MAX_PAYLOAD + 1)
    huge = frames.HEADER.pack(frames.MAGIC, frames.KIND_PARTIAL, SENDER, STEP, 0xFFFFFFFF)
    reader = frames.FrameReader(KEY, SENDER, STEP, LENGTH)
    with pytest.raises(frames.FrameError, match="bytes where"):
        reader.feed(huge)
