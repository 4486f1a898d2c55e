"""sampling.prompt_logprobs: the engine scores every prompt token in the prefill it does anyway
and hands the rows over with the first sample; the same rows whether the prompt was split
over steps, found in a slot's cache, or neither; the end token's own log-probability is listed."""
import pytest

from stackd.engine import accel
from stackd.engine.core import Engine, decode_events_wire, encode_events_wire
from stackd.store import defaults

from .conftest import Driver

TEXT = ("In the beginning the universe was created. This has made a lot of people very angry and "
        "been widely regarded as a bad move. " * 3)


def rows_of(result) -> list:
    carrying = [e for e in result["events"] if e.prompt_logprobs]
    assert len(carrying) == 1, "one event carries the prompt's rows"
    assert carrying[0] is result["events"][0]          # the first sample's
    return carrying[0].prompt_logprobs


def test_every_prompt_token_after_the_first(driver, chat_engine):
    prompt = chat_engine.tokenize(TEXT, False, False)
    rid = driver.submit(prompt, max_tokens=2, logprobs=True, n_top_logprobs=4, prompt_logprobs=True)
    rows = rows_of(driver.wait([rid])[rid])
    assert [token for token, *_ in rows] == prompt[1:]
    for token, logprob, piece, top in rows:
        assert logprob <= 0.0 and len(top) == 4
        assert [lp for _, lp, _ in top] == sorted((lp for _, lp, _ in top), reverse=True)
        assert top[0][1] >= logprob - 1e-6
        assert piece == chat_engine.piece(token)
        assert sum(2.718281828459045 ** lp for _, lp, _ in top) <= 1.0 + 1e-4
    other = driver.submit(prompt, max_tokens=2, logprobs=True)
    assert all(not e.prompt_logprobs for e in driver.wait([other])[other]["events"])   # not asked: none


@pytest.fixture(scope="module")
def invariant_engines():
    """A batch of 16 tokens (the prompt split over many steps) and of 256 (one step), with every
    step on ggml's per-row paths (engine.batch_invariant): a row's numbers are then the same
    however its prompt was split, so the two can be compared closely."""
    accel.register("auto", batch_invariant=True)
    engines = [Engine(defaults.smollm2_path(), slots=2, context_length=512, batch=batch) for batch in (16, 256)]
    yield [Driver(engine) for engine in engines]
    for engine in engines:
        engine.close()
    accel.library().stackd_kernels_batch_invariant(accel.DECODE_STEPS)   # back to the default


def test_chunked_cached_and_whole_prompts_agree(invariant_engines):
    """The second request of the chunked engine finds most of its prompt in a slot's cache and
    decodes it again for its rows."""
    chunked, whole = invariant_engines
    prompt = chunked.engine.tokenize(TEXT, False, False)
    first = chunked.submit(prompt, max_tokens=1, logprobs=True, prompt_logprobs=True)
    rows_split = rows_of(chunked.wait([first])[first])
    again = chunked.submit(prompt + chunked.engine.tokenize(" And then", False, False), max_tokens=1,
                           logprobs=True, prompt_logprobs=True)
    result = chunked.wait([again])[again]
    rows_cached = rows_of(result)
    assert result["events"][-1].n_cached == 0          # scored, so not read from the cache
    one = whole.submit(prompt, max_tokens=1, logprobs=True, prompt_logprobs=True)
    rows_whole = rows_of(whole.wait([one])[one])
    assert len(rows_split) == len(rows_whole) == len(prompt) - 1
    for a, b, c in zip(rows_split, rows_cached, rows_whole):
        assert a[0] == b[0] == c[0]
        assert abs(a[1] - b[1]) < 1e-3 and abs(a[1] - c[1]) < 1e-3


def test_the_end_token_has_its_logprob(driver, chat_engine):
    """A greedy answer that ends by itself lists the end token too (as vLLM does): a harness that
    scores with one generated token reads that last entry."""
    prompt = chat_engine.tokenize("<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK", False, True)
    rid = driver.submit(prompt, max_tokens=64, logprobs=True)
    result = driver.wait([rid])[rid]
    entries = [entry for e in result["events"] for entry in (e.logprobs or [])]
    assert entries and len(entries) == result["events"][-1].n_generated
    token, _, piece, _ = entries[-1]
    if token == 2:                                    # it ended with <|im_end|>
        assert piece == b""


def test_the_rows_cross_the_worker_wire(driver, chat_engine):
    prompt = chat_engine.tokenize("Hello there", False, False)
    rid = driver.submit(prompt, max_tokens=1, logprobs=True, n_top_logprobs=2, prompt_logprobs=True)
    events = driver.wait([rid])[rid]["events"]
    back = decode_events_wire(encode_events_wire(events))
    assert [e.prompt_logprobs for e in back] == [e.prompt_logprobs for e in events]
