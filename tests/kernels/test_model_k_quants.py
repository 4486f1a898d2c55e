"""Greedy generations on a Q4_K_M and a Q5_K_M file (Q4_K, Q5_K, Q6_K: kernels/src/kernels_qk.h), with
our kernels against ggml's, alone and with 16 streams per step, as test_model.py does for the
default Q4_1 model.

The file is made from the default chat model by llama.cpp's own llama-quantize
(testing.quantized_model). SmolLM2's 576-wide matrices cannot be K-quants (a super-block
is 256 weights), so llama-quantize gives them its fallbacks; the ffn_down matrices (1536 wide)
are Q4_K and Q6_K, and those run on our K-quant kernels (the run reports how many of each);
the Q5_0 and Q8_0 fallbacks run on ours too (kernels/README.md, "Q4_0 and Q5_0").

Our K-quant arithmetic is within float rounding of ggml's (test_ops.py); across 30 layers such
differences move logprobs a little and a greedy text parts only at a near tie, so the on/off
comparison is test_model.py's, with this file's own tolerances: a model quantized twice
amplifies rounding about twice as much as the default one. Measured on these 20 prompts with
our matmuls on both sides, switching only attention between ggml's (f16 accumulator) and ours
(f32) moves the Q5_K_M file's logprobs by up to 0.63 nats where the default model's move by
0.27; our matmuls with ggml's attention against kernels off, 0.50 (test_model.py's DRIFT,
reached). So DRIFT_K is 0.75 and TIE_K twice that; a lost block or a bad scale still moves
whole nats. Forcing the AVX2 path gives the AVX-512 path's texts and logprobs exactly, and 16
streams per step give each prompt's text alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stackd.engine import accel
from testing import quantized_model

from .test_model import ROOT, assert_close, ids

pytestmark = pytest.mark.slow

DRIFT_K = 0.75  # nats: above the 0.63 measured (module docstring)
TIE_K = 2 * DRIFT_K

PROMPTS, TOKENS = 8, 64


def greedy_run(model: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.kernels.greedy_run", mode, str(PROMPTS), str(TOKENS)],
                         cwd=ROOT, check=True, capture_output=True, text=True,
                         env={**os.environ, "GREEDY_RUN_MODEL": model})
    return json.loads(out.stdout.strip().splitlines()[-1])


# Per file: its K-quant (with Q6_K, 30 ffn_down in all), and the projections of ours in all:
# every one, the 166 fallbacks too (Q5_0 in Q4_K_M, Q5_1 in Q5_K_M), and the table.
FILES = {"Q4_K_M": ("q4_K", 30 * 7 + 1), "Q5_K_M": ("q5_K", 30 * 7 + 1)}


@pytest.fixture(scope="module", params=list(FILES))
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def model(kind):
    return quantized_model.quantized(kind)


@pytest.fixture(scope="module")
def runs(model):
    if not accel.cpu_supports("avx2"):
        pytest.skip("this CPU lacks AVX2: engine.kernels=auto leaves every matmul to ggml")
    modes = ["off", "auto"] + (["avx2"] if accel.cpu_supports("avx512-vnni") else [])
    return {mode: greedy_run(model, mode) for mode in modes}


def test_k_quant_weights_run_on_our_kernels(runs, kind):
    """Per type, the weights in our buffers: both K-quants of the file are there, alongside
    the tied Q8_0 vocabulary table (llama-quantize's fallback for Q6_K at 576 wide)."""
    k_quant, ours = FILES[kind]
    tensors = runs["auto"]["tensors"]
    assert tensors.get(k_quant, 0) > 0 and tensors.get("q6_K", 0) > 0, tensors
    assert tensors.get(k_quant, 0) + tensors.get("q6_K", 0) == 30, tensors   # one ffn_down a layer
    if ours is not None:
        assert sum(tensors.values()) == ours, tensors
    assert runs["off"]["tensors"] == {}


def test_every_generation_runs_to_length(runs):
    for mode in runs.values():
        assert all(len(tokens) == TOKENS for tokens in mode["alone"] + mode["together"])


def test_the_avx2_path_gives_the_avx512_path_s_bits(runs):
    if "avx2" not in runs:
        pytest.skip("this CPU has no AVX-512 VNNI path to compare the AVX2 one with")
    assert runs["avx2"]["alone"] == runs["auto"]["alone"]


# ggml's own reference is its one-row-at-a-time run: with 16 streams a step its K-quant
# matmuls take a tiled path from 8 rows that adds in another order, and on this file that alone
# moved a token by 2 nats (Q5_K_M, prompt 6, token 13: 28 at -1.11 against 702 at -1.20 with 16
# streams, 702 first alone; 2026-11-28) while ours gives the same bits in any batch (asserted
# below). So both of our runs are held against ggml's alone.
@pytest.mark.parametrize("batching", ["alone", "together"])
def test_kernels_on_and_off_agree_up_to_near_ties(runs, batching):
    for ours, ggml in zip(runs["auto"][batching], runs["off"]["alone"]):
        assert_close(ours, ggml, DRIFT_K, TIE_K)


def test_sixteen_streams_equal_alone_with_kernels_on(runs):
    assert [ids(g) for g in runs["auto"]["together"]] == [ids(g) for g in runs["auto"]["alone"]]
