"""A greedy request with nothing to adjust picks its token off the row of logits in place
(native/engine/sampling.cpp, first_highest) instead of loading the row into llama.cpp's token
array for its greedy sampler. The pick must be the sampler's own in every case: ties (the first
token wins, wherever the lanes of the scan put them), NaN, -inf, rows of any length, and the end
of generation suppressed. The reference is the same sampler with a logit bias of 0 on token 0,
which changes no logit but sends the row through llama.cpp's chain."""
import math

import numpy as np
import pytest

from stackd.engine.core import Sampler, SamplingParams, Vocab
from stackd.store import defaults

EOG = [0, 2]


@pytest.fixture(scope="module")
def vocab():
    return Vocab(defaults.smollm2_path())


def greedy(vocab, reference: bool) -> Sampler:
    params = SamplingParams()
    params.temperature = 0.0
    if reference:
        params.logit_bias = [(0, 0.0)]
    return Sampler(vocab, params)


def both(vocab, logits, suppress=False) -> tuple[int, int]:
    row = np.asarray(logits, dtype=np.float32)
    eog = EOG if len(row) > max(EOG) else []
    return greedy(vocab, False).sample(row, suppress, eog), greedy(vocab, True).sample(row, suppress, eog)


def rows(n_vocab: int):
    rng = np.random.default_rng(7)
    yield "random", rng.normal(size=n_vocab)
    for length in (1, 3, 8, 9, 17, 1000):              # rows shorter than a lane, and tails
        yield f"length {length}", rng.normal(size=length)
    tied = np.zeros(n_vocab)
    for at in (5, 13, 21, 4096, n_vocab - 1):          # equal maxima in different lanes
        tied[at] = 3.0
    yield "ties across lanes", tied
    yield "all equal", np.ones(n_vocab)
    first = np.full(n_vocab, -1.0)
    first[0] = first[8] = 5.0
    yield "tie with token 0", first
    yield "all -inf", np.full(n_vocab, -math.inf)
    one = np.full(n_vocab, -math.inf)
    one[n_vocab // 2] = 0.0
    yield "one finite", one
    nan_first = rng.normal(size=n_vocab)
    nan_first[0] = math.nan
    yield "NaN at token 0", nan_first
    nan_later = rng.normal(size=n_vocab)
    nan_later[[3, 11, 500]] = math.nan
    yield "NaN later", nan_later
    signed_zero = np.full(n_vocab, -1.0)
    signed_zero[9], signed_zero[4] = -0.0, 0.0
    yield "-0 and +0", signed_zero


@pytest.mark.parametrize("suppress", [False, True])
def test_the_pick_in_place_is_the_greedy_samplers(vocab, suppress):
    for name, row in rows(vocab.n_vocab):
        mine, reference = both(vocab, row, suppress)
        assert mine == reference, name


def test_a_suppressed_end_of_generation_leaves_the_next_highest(vocab):
    row = np.linspace(-1.0, 1.0, vocab.n_vocab)
    row[2] = 10.0                                      # the end would win
    row[0] = 9.0                                       # so would another end token
    mine, reference = both(vocab, row, suppress=True)
    assert mine == reference == vocab.n_vocab - 1
    assert both(vocab, row, suppress=False) == (2, 2)
