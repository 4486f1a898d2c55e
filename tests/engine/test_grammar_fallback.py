"""After the grammar rejects a pick, the sampler walks the vocabulary by logit instead of running
the grammar over all of it (native/engine/grammar_prefix.cpp says why that is exact). These tests
drive the real model's logits through both ways side by side and compare what they pick: the
same token for greedy and for seeded sampling with truncating filters, the same distribution for
a chain that truncates nothing (which draws again instead)."""
import math
from collections import Counter

import llama_cpp
import numpy as np
import pytest

from stackd.engine.core import Sampler, SamplingParams, Vocab
from stackd.chat.grammar import json_schema_grammar
from stackd.store import defaults

pytestmark = pytest.mark.slow

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
ENUM = json_schema_grammar({"enum": [f"value {i}" for i in range(256)]})
SMALL_ENUM = json_schema_grammar({"enum": [f"value {i}" for i in range(24)]})   # a cheaper reference
BOOLEAN = json_schema_grammar({"type": "boolean"})
SHORT_STRING = json_schema_grammar({"type": "string", "maxLength": 12})
DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)   # the API's defaults


@pytest.fixture(scope="module")
def model():
    path = defaults.smollm2_path()
    llm = llama_cpp.Llama(path, n_ctx=256, n_batch=64, logits_all=True, verbose=False)
    yield Vocab(path), llm
    llm.close()


def eog_tokens(vocab: Vocab) -> list[int]:
    return sorted({vocab.token_eos, 0, 2})     # SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|>


def sampler(vocab, grammar, full, **sampling):
    params = SamplingParams()
    params.grammar = grammar
    for name, value in sampling.items():
        setattr(params, name, value)
    return Sampler(vocab, params, full_vocabulary=full)


def side_by_side(model, prompt, grammar, steps=24, min_tokens=0, **sampling):
    """Generate with the full-vocabulary sampler; at every step ask the walking one too.
    Returns both token lists and the walking sampler's counts."""
    vocab, llm = model
    eog = eog_tokens(vocab)
    walking, reference = sampler(vocab, grammar, False, **sampling), sampler(vocab, grammar, True, **sampling)
    llm.reset()
    llm.eval(vocab.tokenize(prompt, True, True))
    picked, expected = [], []
    for step in range(steps):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        suppress = step < min_tokens
        picked.append(walking.sample(logits, suppress, eog))
        expected.append(reference.sample(logits, suppress, eog))
        token = expected[-1]
        if token < 0 or token in eog:
            break
        walking.accept(token)
        reference.accept(token)
        llm.eval([token])
    return picked, expected, walking.counts


@pytest.mark.parametrize("grammar, prompt, min_tokens", [
    (ENUM, CHAT.format("hi"), 0),
    (BOOLEAN, "Yes or no?", 20),                 # the grammar completes while the end is suppressed
    (SHORT_STRING, CHAT.format("Name a colour."), 0),
])
def test_greedy_picks_what_the_full_pass_picks(model, grammar, prompt, min_tokens):
    picked, expected, counts = side_by_side(model, prompt, grammar, min_tokens=min_tokens, temperature=0.0)
    assert picked == expected
    assert counts["by_logit"] > 0 and counts["full"] == 0


def test_greedy_with_bias_and_penalties_picks_what_the_full_pass_picks(model):
    picked, expected, counts = side_by_side(
        model, CHAT.format("hi"), SMALL_ENUM, temperature=0.0, repeat_penalty=1.3, frequency_penalty=0.5,
        logit_bias=[(18, -5.0), (3221, 4.0), (33, 2.5)])
    assert picked == expected
    assert counts["by_logit"] > 0


@pytest.mark.parametrize("filters", [
    DEFAULTS,
    dict(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0),
    dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.1),
    dict(temperature=0.7, top_k=3, top_p=1.0, min_p=0.0),
])
def test_seeded_sampling_picks_what_the_full_pass_picks(model, filters):
    """The chain runs on the allowed tokens found, in the full pass's order, and draws as often:
    the same seed gives the same tokens, not only the same distribution."""
    for grammar, prompt, min_tokens in ((SMALL_ENUM, CHAT.format("hi"), 0), (BOOLEAN, "Yes or no?", 20)):
        picked, expected, counts = side_by_side(model, prompt, grammar, min_tokens=min_tokens, seed=3, **filters)
        assert picked == expected, filters
        assert counts["by_logit"] > 0


def test_a_chain_that_truncates_nothing_draws_from_the_same_distribution(model):
    """No prefix decides a draw over every allowed token; drawing again until the grammar allows
    the draw is rejection sampling, whose draws follow the full pass's distribution."""
    vocab, llm = model
    llm.reset()
    llm.eval(vocab.tokenize("Yes or no?", True, True))
    logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    logits[[10469, 21642, 100, 86]] += 6.0      # "true", "false", "t", "f": often drawn, not always
    n = 200
    draws = {}
    for full in (False, True):
        s = sampler(vocab, BOOLEAN, full, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
        draws[full] = Counter(s.sample(logits) for _ in range(n))
        if not full:
            assert s.counts["by_rejection"] > 0 and s.counts["full"] > 0
    for token in set(draws[False]) | set(draws[True]):
        p_walk, p_full = draws[False][token] / n, draws[True][token] / n
        p = (p_walk + p_full) / 2
        assert abs(p_walk - p_full) <= 5 * math.sqrt(p * (1 - p) * 2 / n) + 1e-9, (token, draws)


@pytest.mark.parametrize("filters", [
    dict(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0),
    dict(temperature=1.0, top_k=400, top_p=0.6, min_p=0.0),
    dict(temperature=1.0, top_k=0, top_p=0.7, min_p=0.02),
])
def test_a_flat_distribution_walks_until_the_top_p_cut_is_known(model, filters):
    """With flat logits and a grammar that allows a third of the vocabulary, the allowed tokens
    beyond the first batches still move top_p's cut: deciding early would pick differently."""
    vocab, llm = model
    llm.reset()
    llm.eval(vocab.tokenize(CHAT.format("hi"), True, True))
    logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32) * 0.05
    walking, reference = (sampler(vocab, "root ::= [a-z]+", full, seed=5, **filters) for full in (False, True))
    picked = [walking.sample(logits) for _ in range(40)]
    assert picked == [reference.sample(logits) for _ in range(40)]
    assert walking.counts["by_logit"] > 0
