"""Greedy generations with our kernels equal ggml's, alone and with 16 streams per step.

Registration is per process, so each mode runs in its own process (greedy_run.py):
20 prompts x 128 tokens, each alone and then 16 at a time. Our MUL_MAT is bit for bit
ggml's (test_ops.py), so the texts must be identical, not merely close.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from server.engine import accel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS, TOKENS = 20, 128


def generations(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.kernels.greedy_run", mode, str(PROMPTS),
                          str(TOKENS)], cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs():
    if not accel.cpu_supports("avx2"):
        pytest.skip("this CPU lacks AVX2: engine.kernels=auto leaves every matmul to ggml")
    return {mode: generations(mode) for mode in ("off", "auto")}


def test_kernels_registered_only_when_asked(runs):
    assert runs["off"]["path"] is None
    assert runs["auto"]["path"] in ("avx2", "avx512-vnni")


def test_every_generation_runs_to_length(runs):
    for mode in runs.values():
        assert len(mode["alone"]) == len(mode["together"]) == PROMPTS
        assert all(len(tokens) == TOKENS for tokens in mode["alone"] + mode["together"])


def test_alone_equal_with_kernels_on_and_off(runs):
    assert runs["auto"]["alone"] == runs["off"]["alone"]


def test_sixteen_streams_equal_with_kernels_on_and_off(runs):
    assert runs["auto"]["together"] == runs["off"]["together"]


def test_sixteen_streams_equal_alone_with_kernels_on(runs):
    assert runs["auto"]["together"] == runs["auto"]["alone"]


def test_the_tied_embedding_table_is_ours_with_kernels_on(runs):
    """SmolLM2's Q8_0 embedding table is tied to its vocabulary projection: with kernels on
    both are one tensor in our buffer, and the input rows are read on our device
    (kernels/src/get_rows.h). Left on the CPU, llama.cpp would load the matrix a second time
    for our projection (+28 MiB of a worker; bench/startup.py measures the memory)."""
    assert runs["auto"]["table_ours"] is True
    assert runs["off"]["table_ours"] is False
