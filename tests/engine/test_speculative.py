"""Draftless speculative decoding (prompt lookup) against the same engine with drafting off, on the
real default model: greedy output byte for byte, seeded sampling draw for draw, and every limit
(max_tokens, stop strings, grammar, logprobs, min_tokens) where it was."""
import pytest

from stackd.engine import accel
from stackd.engine.core import Engine, STATUS_LENGTH
from stackd.store import defaults

from .conftest import Driver, chat_prompt

REPORT = ("The quarterly report lists revenue of 4.2 million euros, up 12 percent, with costs of 3.1 "
          "million. The board approved a dividend of 0.15 euros per share, payable on 14 March to "
          "holders of record on 1 March. Headcount grew from 212 to 240, mostly in engineering.")
CODE = ("def total(items):\n    result = 0\n    for item in items:\n        result += item.price\n"
        "    return result\n")
# prompts whose answers copy from the prompt (drafts accepted often) and prompts whose answers
# do not (drafts rare, rejected when made)
COPYING = [f"Repeat this text exactly:\n{REPORT}",
           f"Extract as JSON with keys revenue, costs, dividend, headcount:\n{REPORT}",
           f"Rename the function to sum_prices and return the code:\n{CODE}",
           f"Summarize in two sentences:\n{REPORT}",
           "List the numbers from 1 to 40, separated by commas."]
FREE = ["Write a haiku about the sea.", "What is 17 times 23?", "Name three colors.",
        "Tell me a short story about a fox and a crow.", "Why is the sky blue?",
        "Translate 'good morning' to French.", "Give me a tip for learning to cook."]


# 256 cells a sequence: ggml's CPU flash attention takes another path (the KV split over the
# threads, another summation order) for a lone sequence's one-token step once its KV view reaches
# 512 cells, which a verification step (several rows) never takes, so past 256 tokens nothing
# but engine.batch_invariant rules out a part at a near tie (docs/engine.md;
# test_batch_invariance.py). Short contexts also meet the context limit inside a draft.
def make_engine(draft_max: int, batch: int = 256, **kw) -> Engine:
    return Engine(defaults.smollm2_path(), slots=4, context_length=256, batch=batch,
                  speculative_draft_max=draft_max, **kw)


@pytest.fixture(scope="module")
def engines():
    # our kernels, as a daemon has them (engine.kernels = auto): batch-invariant, where ggml's own
    # repacked Q8_0 matmul gives a row another rounding in a group of four rows than alone, which
    # parts greedy texts at near ties between a verification step and a plain one (and between a
    # sequence under load and alone). Models loaded before this keep ggml's matmuls.
    accel.register("auto")
    on, off = make_engine(8), make_engine(0)
    yield Driver(on), Driver(off)
    on.close()
    off.close()


def run(driver: Driver, text: str, **kw) -> dict:
    rid = driver.submit(chat_prompt(driver.engine, text), **kw)
    return driver.wait([rid])[rid]


def both(engines, text: str, **kw) -> tuple[dict, dict]:
    on, off = engines
    return run(on, text, **kw), run(off, text, **kw)


def drafts(result: dict) -> tuple[int, int]:
    t = result["events"][-1].timings
    return t.n_drafted, t.n_draft_accepted


def test_greedy_output_is_byte_identical_with_and_without_drafts(engines):
    accepted = 0
    for text in COPYING + FREE:
        on, off = both(engines, text, max_tokens=160)
        assert on["text"] == off["text"], text
        assert on["status"] == off["status"]
        assert on["events"][-1].n_generated == off["events"][-1].n_generated
        assert drafts(off) == (0, 0)
        accepted += drafts(on)[1]
    assert accepted > 100           # the copying prompts did take the drafted path


def test_a_copying_answer_takes_several_tokens_a_step(engines):
    on, off = both(engines, COPYING[0], max_tokens=120)
    n_drafted, n_accepted = drafts(on)
    assert 0 < n_accepted <= n_drafted
    assert on["events"][-1].n_generated == off["events"][-1].n_generated
    assert len(on["events"]) < len(off["events"]) / 2     # events are steps: fewer of them
    assert sum(e.n_tokens for e in on["events"]) == on["events"][-1].n_generated


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 33])
def test_max_tokens_holds_inside_a_draft(engines, max_tokens):
    on, off = both(engines, COPYING[0], max_tokens=max_tokens)
    assert on["text"] == off["text"]
    assert on["status"] == STATUS_LENGTH
    assert on["events"][-1].n_generated == max_tokens


def test_a_stop_string_inside_a_draft_ends_the_text_where_it_would(engines):
    on, off = both(engines, COPYING[0], max_tokens=120, stop=["dividend"])
    assert on["text"] == off["text"] and b"dividend" not in on["text"]
    assert on["status"] == off["status"]
    assert on["events"][-1].n_generated == off["events"][-1].n_generated


def test_logprobs_come_for_every_accepted_token(engines):
    on, off = both(engines, COPYING[0], max_tokens=60, logprobs=True, n_top_logprobs=2)
    assert drafts(on)[1] > 0
    lp_on = [entry for e in on["events"] for entry in e.logprobs]
    lp_off = [entry for e in off["events"] for entry in e.logprobs]
    assert [t for t, _, _, _ in lp_on] == [t for t, _, _, _ in lp_off]
    assert [p for _, p, _, _ in lp_on] == pytest.approx([p for _, p, _, _ in lp_off], abs=1e-4)
    assert len(lp_on) == 60


def test_a_grammar_holds_on_the_drafted_path(engines):
    grammar = 'root ::= "{\\"revenue\\": \\"" [0-9.a-z ]+ "\\"}"'
    on, off = both(engines, COPYING[1], max_tokens=60, grammar=grammar)
    assert on["text"] == off["text"] and on["text"].startswith(b'{"revenue": "')


def test_min_tokens_counts_the_tokens_of_a_draft(engines):
    on, off = both(engines, "Repeat exactly: one two three four five six seven eight nine ten",
                   max_tokens=40, min_tokens=30)
    assert on["text"] == off["text"]
    assert on["events"][-1].n_generated == off["events"][-1].n_generated >= 30


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_seeded_sampling_draws_the_same_tokens_with_and_without_drafts(engines, temperature):
    # Each position is sampled exactly as without drafting (same chain, same random draws, in
    # order) and a draft is kept while the draw equals it: a draft x is kept with probability
    # p(x), and a draw that differs is distributed as p without x, renormalised. So a seed gives
    # the same text either way, which is the distribution kept, seed by seed.
    accepted = 0
    for seed in range(10):
        text = COPYING[seed % 3]
        on, off = both(engines, text, max_tokens=48, temperature=temperature, seed=seed)
        assert on["text"] == off["text"], (seed, text)
        accepted += drafts(on)[1]
    assert accepted > 20


def test_first_tokens_at_temperature_one_follow_the_same_distribution(engines):
    """The first three tokens over many seeds, drafting on vs off, as frequencies: a chi-square
    on the (pooled) 3-token prefixes stays under the 0.999 quantile. (The seeded test above is the
    stronger check; this one holds even if draws were not matched seed by seed.)"""
    on, off = engines
    seeds = range(0, 120)
    prefix_on, prefix_off = {}, {}
    for seed in seeds:
        for driver, counts, base in ((on, prefix_on, 0), (off, prefix_off, 10_000)):
            r = run(driver, COPYING[0], max_tokens=3, temperature=1.0, seed=seed + base)
            counts[r["text"]] = counts.get(r["text"], 0) + 1
    keys = set(prefix_on) | set(prefix_off)
    rare = [k for k in keys if prefix_on.get(k, 0) + prefix_off.get(k, 0) < 10]
    cells = [k for k in keys if k not in rare]
    table = [(prefix_on.get(k, 0), prefix_off.get(k, 0)) for k in cells]
    table.append((sum(prefix_on.get(k, 0) for k in rare), sum(prefix_off.get(k, 0) for k in rare)))
    table = [row for row in table if sum(row) > 0]
    n = len(seeds)
    chi2 = sum((a - b) ** 2 / (a + b) for a, b in table)   # two samples of equal size n
    dof = max(len(table) - 1, 1)
    # 0.999 quantile of chi-square, Wilson-Hilferty approximation
    z = 3.09
    bound = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    assert chi2 <= bound, (chi2, bound, table)
    assert sum(prefix_on.values()) == sum(prefix_off.values()) == n


def test_a_request_opts_out(engines):
    on, _ = engines
    opted_out = run(on, COPYING[0], max_tokens=60, speculative=False)
    default = run(on, COPYING[0], max_tokens=60)
    assert drafts(opted_out) == (0, 0) and drafts(default)[0] > 0
    assert opted_out["text"] == default["text"]


def test_the_engine_counts_drafted_and_accepted_tokens(engines):
    on, off = engines
    before = on.engine.stats()
    result = run(on, COPYING[0], max_tokens=80)
    after = on.engine.stats()
    n_drafted, n_accepted = drafts(result)
    assert after["n_draft_tokens"] - before["n_draft_tokens"] == n_drafted > 0
    assert after["n_draft_accepted_tokens"] - before["n_draft_accepted_tokens"] == n_accepted
    n_generated = result["events"][-1].n_generated
    assert after["n_generation_tokens"] - before["n_generation_tokens"] == n_generated
    assert off.engine.stats()["n_draft_tokens"] == 0


def test_a_full_step_gets_no_drafts():
    # engine.speculative_step_tokens: four sequences decoding fill a step of four tokens (their
    # prompts are prefilled in one step, so they decode in lockstep from the first token)
    engine = make_engine(8, batch=512, speculative_step_tokens=4)
    try:
        driver = Driver(engine)
        ids = [driver.submit(chat_prompt(engine, COPYING[0]), max_tokens=40) for _ in range(4)]
        results = driver.wait(ids)
        assert all(drafts(results[rid]) == (0, 0) for rid in ids)
        alone = run(driver, COPYING[0], max_tokens=40)
        assert drafts(alone)[0] > 0
        assert len({results[rid]["text"] for rid in ids}) == 1   # one prompt, one greedy text
    finally:
        engine.close()


def test_a_sequence_whose_drafts_keep_failing_stops_drafting_for_a_while(engines):
    # A sampled poem repeats words (drafts found) but not what followed them (drafts rejected):
    # 369 tokens drafted, 16 % accepted, in 200 generated before drafting was judged. Judged every
    # 16 drafted tokens and resting 64 tokens under a quarter accepted while other sequences share
    # the steps, it drafts at most 23 tokens (16, and a draft of up to 7 past them) per 64
    # generated, and one window more. A companion that never drafts and outlasts it shares every
    # one of its steps: alone, a sequence always drafts.
    on, off = engines
    prompt = chat_prompt(on.engine, "Write a poem about the sea, the sky and the sea again.")
    companion = chat_prompt(on.engine, "Tell me a long story.")

    def poem(driver):
        rid = driver.submit(prompt, max_tokens=200, temperature=0.8, seed=3)
        beside = driver.submit(companion, max_tokens=400, ignore_eos=True, speculative=False)
        return driver.wait([rid, beside])[rid]

    drafted, plain = poem(on), poem(off)
    n_drafted, n_accepted = drafts(drafted)
    n_generated = drafted["events"][-1].n_generated
    assert n_drafted > 0 and n_accepted * 4 < n_drafted          # it tried, and it did not pay
    assert n_drafted <= 23 * (n_generated // 64 + 2)
    assert drafted["text"] == plain["text"]                      # the same draws either way
