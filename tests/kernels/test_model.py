"""Greedy generations with our kernels against ggml's, alone and with 16 streams per step.

Registration is per process, so each mode runs in its own process (greedy_run.py):
20 prompts x 128 tokens, each alone and then 16 at a time, with each token's logprob and
top-5 alternatives.

With kernels on, 16 streams per step give exactly the texts each prompt gives alone: each
row's arithmetic depends on nothing else in the step (kernels/src/kernels.h).

Against kernels off the texts are not identical, and the test compares logprobs instead. Our
matmul sums each block's exact integer product once where ggml adds eight float partial sums
(test_ops.py bounds the difference: ~1e-7 of the terms' magnitude). After 30 layers, each
re-quantizing its activations to 8 bits, such differences move SmolLM2's logprobs by up to
~0.25 nats, and a greedy text changes where two candidates are that close. ggml alone does the
same when only flash attention is switched (llama.cpp's `-fa`; measured here on these 20
prompts: every text changes, logprobs move by up to 0.25 nats; kernels/README.md). So the
test asserts, per prompt, that the two runs agree to DRIFT nats on every token they share,
and that where they part, each run's token is among the other's top alternatives within TIE
nats of its best: a near tie, not a different model; and, teacher-forced along ggml's texts
(so nothing can part), that the logprobs agree at every position. A wrong kernel (a lost
block, a bad scale) moves logprobs by whole nats from the first token.
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
PROMPTS, TOKENS = 20, 128
DRIFT = 0.5   # nats: twice the largest move measured, ours and flash attention's alike
TIE = 1.0     # nats: a top-2 gap both runs' drifts can close
FORCED = 5    # prompts scored teacher-forced (128 one-token requests each)


def greedy_run(*args: str, stdin: str | None = None) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.kernels.greedy_run", *args], cwd=ROOT,
                         check=True, capture_output=True, text=True, input=stdin)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs():
    if not accel.cpu_supports("avx2"):
        pytest.skip("this CPU lacks AVX2: engine.kernels=auto leaves every matmul to ggml")
    return {mode: greedy_run(mode, str(PROMPTS), str(TOKENS)) for mode in ("off", "auto")}


@pytest.fixture(scope="module")
def forced(runs):
    """Kernels on, teacher-forced along ggml's greedy texts of the first FORCED prompts: the
    top alternatives at every position, the context the same on both sides."""
    texts = [[token for token, _, _ in g] for g in runs["off"]["alone"][:FORCED]]
    return greedy_run("score", "auto", stdin=json.dumps({"sequences": texts}))["scored"]


def test_kernels_registered_only_when_asked(runs):
    assert runs["off"]["path"] is None
    assert runs["auto"]["path"] in ("avx2", "avx512-vnni")


def ids(generation: list[list]) -> list[int]:
    return [token for token, _, _ in generation]


def test_every_generation_runs_to_length(runs):
    for mode in runs.values():
        assert len(mode["alone"]) == len(mode["together"]) == PROMPTS
        assert all(len(tokens) == TOKENS for tokens in mode["alone"] + mode["together"])


def test_sixteen_streams_equal_alone_with_kernels_on(runs):
    assert [ids(g) for g in runs["auto"]["together"]] == [ids(g) for g in runs["auto"]["alone"]]


def assert_close(ours: list[list], ggml: list[list], drift: float = DRIFT, tie: float = TIE) -> int | None:
    """Same token and logprob within `drift` up to the first difference; there, a near tie.
    Returns where the texts part (None: identical)."""
    for i, ((token, logprob, top), (ref_token, ref_logprob, ref_top)) in enumerate(zip(ours, ggml)):
        if token != ref_token:
            ref_alternatives, alternatives = dict(ref_top), dict(top)
            assert token in ref_alternatives and ref_token in alternatives, (i, token, ref_token)
            assert ref_logprob - ref_alternatives[token] <= tie, (i, ref_logprob, ref_alternatives)
            assert logprob - alternatives[ref_token] <= tie, (i, logprob, alternatives)
            return i
        assert abs(logprob - ref_logprob) <= drift, (i, token, logprob, ref_logprob)
    return None


@pytest.mark.parametrize("batching", ["alone", "together"])
def test_kernels_on_and_off_agree_up_to_near_ties(runs, batching):
    for ours, ggml in zip(runs["auto"][batching], runs["off"][batching]):
        assert_close(ours, ggml)


def test_kernels_on_scores_ggml_s_texts_as_ggml_does(runs, forced):
    """Teacher-forced, so the texts cannot part: at all 128 positions of each text, ggml's
    greedy token is among our top alternatives with its logprob within DRIFT of ggml's, and
    it is our first choice too at nearly every position (measured: 614 of 640)."""
    agree = 0
    for ours, ggml in zip(forced, runs["off"]["alone"]):
        for j, (alternatives, (token, logprob, _)) in enumerate(zip(ours, ggml)):
            alternatives = dict(alternatives)
            assert token in alternatives, (j, token, alternatives)
            assert abs(alternatives[token] - logprob) <= DRIFT, (j, token, alternatives[token], logprob)
            agree += max(alternatives, key=alternatives.get) == token
    assert agree >= 0.9 * FORCED * TOKENS, agree


def boundary_only(top: dict, other: dict) -> bool:
    """Every candidate of `top` that `other` lacks is within DRIFT of top's fifth: a near tie
    at the boundary, which the runs' drifts can swap."""
    fifth = min(top.values())
    return all(logprob - fifth <= DRIFT for token, logprob in top.items() if token not in other)


def test_kernels_on_and_off_give_the_same_first_candidates(runs):
    """The first token's top-5 candidates match up to near ties at the fifth place, and the
    leading three match as a set for most prompts: the distributions are the same model's, not
    merely near somewhere. (Where the fifth and sixth are a tenth of a nat apart, attention's
    own arithmetic swaps them: ggml's f16 accumulator against our f32 one, kernels/README.md.)"""
    leaders = 0
    for ours, ggml in zip(runs["auto"]["alone"], runs["off"]["alone"]):
        top, ref_top = dict(ours[0][2]), dict(ggml[0][2])
        assert boundary_only(top, ref_top) and boundary_only(ref_top, top), (top, ref_top)
        leaders += set(sorted(top, key=top.get)[-3:]) == set(sorted(ref_top, key=ref_top.get)[-3:])
    assert leaders >= PROMPTS * 3 // 4, leaders


def test_the_tied_embedding_table_is_ours_with_kernels_on(runs):
    """SmolLM2's Q8_0 embedding table is tied to its vocabulary projection: with kernels on
    both are one tensor in our buffer, and the input rows are read on our device
    (kernels/src/get_rows.h). Left on the CPU, llama.cpp would load the matrix a second time
    for our projection (+28 MiB of a worker; bench/startup.py measures the memory)."""
    assert runs["auto"]["table_ours"] is True
    assert runs["off"]["table_ours"] is False
