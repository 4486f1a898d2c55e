"""The thinking budget (native/engine/sampling.cpp, SamplingParams.reasoning_*): after N thinking
tokens the sampler forces the template's end-of-thinking tag, token by token, whatever the
logits say, and the answer goes on. Driven with made-up logits on the real vocabulary (the
state machine at each edge), then through the real engine and model."""
import numpy as np
import pytest

from stackd.engine.core import STATUS_LENGTH, Sampler, SamplingParams, Vocab
from stackd.store import defaults

from .conftest import chat_prompt


@pytest.fixture(scope="module")
def vocab():
    return Vocab(defaults.smollm2_path())


def tokens(vocab, text):
    return vocab.tokenize(text, False, True)


def budget_params(vocab, budget, *, open_=False, **extra):
    p = SamplingParams()
    p.temperature = 0.0
    p.reasoning_budget = budget
    p.reasoning_start = "<think>"
    p.reasoning_end = "</think>"
    p.reasoning_forced = tokens(vocab, "</think>")
    p.reasoning_open = open_
    for name, value in extra.items():
        setattr(p, name, value)
    return p


def favouring(vocab, token):
    logits = np.zeros(vocab.n_vocab, dtype=np.float32)
    logits[token] = 10.0
    return logits


def step(sampler, logits):
    token = sampler.sample(logits)
    sampler.accept(token)
    return token


def think(sampler, vocab, n, word=" hmm"):
    """n greedy steps whose logits all favour `word`'s token; the tokens picked."""
    logits = favouring(vocab, tokens(vocab, word)[0])
    return [step(sampler, logits) for _ in range(n)]


@pytest.mark.parametrize("budget", [0, 1, 7])
def test_the_end_tag_is_forced_after_exactly_budget_thinking_tokens(vocab, budget):
    sampler = Sampler(vocab, budget_params(vocab, budget))
    hmm = tokens(vocab, " hmm")[0]
    forced = tokens(vocab, "</think>")
    assert len(forced) > 1                     # not one special token here: forced one by one
    for t in tokens(vocab, "<think>"):
        sampler.accept(t)
    assert sampler.thinking == ("forcing" if budget == 0 else "counting")
    picked = think(sampler, vocab, budget + len(forced) + 3)
    assert picked[:budget] == [hmm] * budget
    assert picked[budget:budget + len(forced)] == forced       # against the logits
    assert picked[budget + len(forced):] == [hmm] * 3           # and the answer goes on
    assert sampler.thinking == "done"
    assert sampler.thinking_tokens == budget


def test_one_token_under_the_budget_is_not_forced(vocab):
    sampler = Sampler(vocab, budget_params(vocab, 5, open_=True))
    assert sampler.thinking == "counting"       # the prompt opened the thinking
    think(sampler, vocab, 4)
    assert sampler.thinking == "counting"
    think(sampler, vocab, 1)
    assert sampler.thinking == "forcing"


def test_a_natural_end_is_not_forced(vocab):
    sampler = Sampler(vocab, budget_params(vocab, 8, open_=True))
    think(sampler, vocab, 3)
    for t in tokens(vocab, "</think>"):
        sampler.accept(t)
    assert sampler.thinking == "done"
    assert think(sampler, vocab, 12) == [tokens(vocab, " hmm")[0]] * 12


def test_the_tag_is_matched_on_text_whatever_the_tokens(vocab):
    """A model may spell the tag in other tokens than the tokenizer's: still the end."""
    sampler = Sampler(vocab, budget_params(vocab, 8, open_=True))
    for piece in ("</", "th", "ink", ">"):
        sampler.accept(tokens(vocab, piece)[0])
    assert sampler.thinking == "done"


def test_the_budget_is_for_the_whole_answer(vocab):
    sampler = Sampler(vocab, budget_params(vocab, 12))
    for t in tokens(vocab, "<think>"):
        sampler.accept(t)
    think(sampler, vocab, 3)
    for t in tokens(vocab, "</think> so <think>"):
        sampler.accept(t)
    assert sampler.thinking == "counting"
    spent = sampler.thinking_tokens             # 3, and the tag's pieces before it was whole
    assert 3 <= spent < 12
    think(sampler, vocab, 12 - spent - 1)
    assert sampler.thinking == "counting"
    think(sampler, vocab, 1)
    assert sampler.thinking == "forcing"        # a second block does not start afresh


def test_a_natural_end_tag_on_the_budget_edge_is_not_doubled(vocab):
    """The budget runs out while the model is part-way into the end tag: it may finish it."""
    sampler = Sampler(vocab, budget_params(vocab, 3, open_=True))
    think(sampler, vocab, 2)
    pieces = [tokens(vocab, p)[0] for p in ("</", "th", "ink", ">")]
    for t in pieces[:-1]:
        sampler.accept(t)
        assert sampler.thinking == "counting"   # over the budget, but the tag is on its way
    sampler.accept(pieces[-1])
    assert sampler.thinking == "done"
    sampler = Sampler(vocab, budget_params(vocab, 3, open_=True))
    think(sampler, vocab, 2)
    sampler.accept(pieces[0])
    sampler.accept(tokens(vocab, " no")[0])     # not the tag after all: forced at once
    assert sampler.thinking == "forcing"


def test_no_bound_and_no_tags(vocab):
    unbounded = Sampler(vocab, budget_params(vocab, -1, open_=True))
    think(unbounded, vocab, 50)
    assert unbounded.thinking == "counting"
    plain = SamplingParams()
    plain.temperature = 0.0
    assert Sampler(vocab, plain).thinking == "off"


def test_a_forced_token_outside_the_vocabulary_is_refused(vocab):
    with pytest.raises(ValueError):
        Sampler(vocab, budget_params(vocab, 4, reasoning_forced=[vocab.n_vocab]))


def test_a_lazy_grammar_sleeps_through_the_thinking(vocab):
    """A trigger word thought about is not a call: the tool grammar wakes only after the end tag."""
    grammar = 'root ::= "<tool_call>" " {}"'
    sampler = Sampler(vocab, budget_params(vocab, 64, open_=True, grammar=grammar, grammar_lazy=True,
                                           grammar_triggers=["<tool_call>"]))
    for t in tokens(vocab, "maybe <tool_call> here"):
        sampler.accept(t)
    hmm = tokens(vocab, " hmm")[0]
    assert step(sampler, favouring(vocab, hmm)) == hmm          # still free text
    for t in tokens(vocab, "</think><tool_call>"):
        sampler.accept(t)
    assert step(sampler, favouring(vocab, hmm)) != hmm          # now the grammar holds


def test_a_grammar_that_refuses_the_tag_wins(vocab):
    """A grammar that is awake and cannot take the tag: the answer goes on unforced."""
    sampler = Sampler(vocab, budget_params(vocab, 0, open_=True, grammar='root ::= [a-z ]+'))
    assert sampler.thinking == "forcing"
    token = step(sampler, favouring(vocab, tokens(vocab, " hmm")[0]))
    assert token == tokens(vocab, " hmm")[0]
    assert sampler.thinking == "done"


def test_the_engine_forces_the_tag_and_the_answer_continues(driver, chat_engine):
    prompt = chat_prompt(chat_engine, "Explain why the sky is blue.") + chat_engine.tokenize("<think>\n", False, True)
    forced = chat_engine.tokenize("</think>", False, True)
    budget = 6
    rid = driver.submit(prompt, max_tokens=budget + len(forced) + 8, reasoning_budget=budget,
                        reasoning_start="<think>", reasoning_end="</think>",
                        reasoning_forced=forced, reasoning_open=True)
    result = driver.wait([rid])[rid]
    assert result["status"] == STATUS_LENGTH
    text = result["text"].decode()
    thought, sep, answer = text.partition("</think>")
    assert sep, text
    assert "</think>" not in answer
    assert len(chat_engine.tokenize(thought, False, True)) <= budget + 1   # retokenized: near budget
    assert answer                                                         # the answer went on


def test_a_grammar_prefilled_with_the_generation_prompt(vocab):
    """A family's tool grammar starts at the generation prompt: the sampler reads it first."""
    p = SamplingParams()
    p.temperature = 0.0
    p.grammar = 'root ::= "<|im_start|>assistant\\n" "<think>\\n" [a-z ]* "</think>" " yes"'
    p.grammar_prefill = tokens(vocab, "<|im_start|>assistant\n<think>\n")
    sampler = Sampler(vocab, p)
    hmm = tokens(vocab, " hmm")[0]
    assert step(sampler, favouring(vocab, hmm)) == hmm           # in the thinking already
    p.grammar_prefill = tokens(vocab, "<|im_start|>user\n")
    with pytest.raises(ValueError, match="generation prompt"):
        Sampler(vocab, p)
    p.grammar_prefill = [vocab.n_vocab]
    with pytest.raises(ValueError):
        Sampler(vocab, p)
