"""Graph fusion (kernels/src/fusion.h) computes exactly what the nodes it replaces compute.

One process (fusion_run.py, two threads) generates greedily with fusion on, then off, each
prompt alone, 16 streams sharing every step, and one long prompt whose prefill takes ggml's
tiled paths: the tokens and every token's logprob are the same, bit for bit, and fusion did
fuse (a layer's residual add, norm and weight; its k and v; its gate and up).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stackd.engine import accel

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYERS = 30   # SmolLM2-135M's
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def run():
    if not accel.cpu_supports("avx2"):
        pytest.skip("this CPU lacks AVX2: engine.kernels=auto leaves every node to ggml")
    out = subprocess.run([sys.executable, "-m", "tests.kernels.fusion_run", str(MAX_TOKENS)], cwd=ROOT,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tokens(generation: list) -> list:
    return [(token, logprob) for token, logprob, _ in generation]


def test_fusion_fuses_every_layer_and_off_fuses_nothing(run):
    assert run["off"]["fused"] == 0
    # each decode step of one stream: per layer at least the add-norm (2), k with v (1) and
    # gate with up (1); the prompts' steps fuse too
    steps = 4 * MAX_TOKENS
    assert run["on"]["fused"] >= steps * LAYERS * 4


@pytest.mark.parametrize("part", ["alone", "together"])
def test_greedy_tokens_and_logprobs_are_the_same_with_fusion_on_and_off(run, part):
    on, off = run["on"][part], run["off"][part]
    assert len(on) == len(off) > 0
    for a, b in zip(on, off):
        assert len(a) == MAX_TOKENS
        assert tokens(a) == tokens(b)


def test_a_long_prompt_s_prefill_and_decode_are_the_same_with_fusion_on_and_off(run):
    assert run["on"]["long_prompt_tokens"] > 256   # more than one 256-token batch
    assert tokens(run["on"]["long"]) == tokens(run["off"]["long"])
