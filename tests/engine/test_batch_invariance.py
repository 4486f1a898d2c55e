"""engine.batch_invariant (kernels/src/backend.cpp, "One arithmetic per row"): with it on, a
greedy answer does not depend on what shared its steps. Long prompts and answers on purpose:
ggml's CPU flash attention tiles a step of 64 query rows or more (a prefill) and splits the KV of
a lone sequence's one-token step once its view reaches 512 cells, each adding in another order
than the per-row loop; with the switch off, each of these prompts prefilled beside another
sequence parts from the same prompt alone (measured on the default model)."""
import pytest

from stackd.engine import accel
from stackd.engine.core import Engine
from stackd.store import defaults

from .conftest import Driver, chat_prompt
from .test_speculative import REPORT

PROMPTS = [f"Write a long essay about this report, with every detail:\n{REPORT}",
           f"Summarize and then discuss this report at length:\n{REPORT}",
           f"Write a long story inspired by this report:\n{REPORT}"]
COMPANION = "Describe a long walk through a busy city market."
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def engines():
    accel.register("auto", batch_invariant=True)
    plain, drafting = (Engine(defaults.smollm2_path(), slots=4, context_length=1024, batch=256,
                              speculative_draft_max=n) for n in (0, 8))
    yield Driver(plain), Driver(drafting)
    plain.close()
    drafting.close()
    accel.library().stackd_kernels_batch_invariant(accel.DECODE_STEPS)   # back to the default


def answers(driver: Driver, prompts: list[list[int]]) -> list[bytes]:
    # every answer runs to MAX_TOKENS: its view passes 512 cells whatever the text says
    ids = [driver.submit(prompt, max_tokens=MAX_TOKENS, ignore_eos=True) for prompt in prompts]
    done = driver.wait(ids)
    return [done[rid]["text"] for rid in ids]


@pytest.mark.parametrize("text", PROMPTS)
def test_a_greedy_answer_is_the_same_alone_drafted_and_beside_another_sequence(engines, text):
    plain, drafting = engines
    prompt, companion = chat_prompt(plain.engine, text), chat_prompt(plain.engine, COMPANION)
    [reference] = answers(plain, [prompt])
    assert len(reference) > 1000, "the answer must be long enough to reach the paths that differ"

    assert answers(drafting, [prompt]) == [reference], "drafted and verified"
    assert answers(plain, [companion, prompt])[1] == reference, "beside another sequence"
