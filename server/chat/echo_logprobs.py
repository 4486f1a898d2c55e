"""A completion prompt scored token by token (echo with logprobs): what lm-evaluation-harness's
`local-completions` asks for every log-likelihood task.

The engine finds each prompt token's log-probability in the prefill it does anyway
(sampling.prompt_logprobs) and hands them over with the first sample. Only the first choice
of each prompt asks for them (the others share its rows); the first prompt token has none, so
its piece comes from the vocabulary here."""
from __future__ import annotations

from ..engine.core import SAMPLING_FIELDS, SamplingParams
from . import pieces


def scoring(jobs: list, candidates: int) -> list:
    """`jobs` (prompt, max_tokens, sampling; `candidates` per prompt) with the first of each
    prompt's asking for the prompt's log-probabilities."""
    out = []
    for i, (prompt, max_tokens, sampling) in enumerate(jobs):
        if i % candidates == 0:
            sampling = _copy(sampling)
            sampling.prompt_logprobs = True
        out.append((prompt, max_tokens, sampling))
    return out


def share_rows(choices: list, candidates: int) -> None:
    """Every choice of a prompt gets the rows its first choice brought."""
    for start in range(0, len(choices), candidates):
        for choice in choices[start + 1:start + candidates]:
            choice.prompt_logprobs = choices[start].prompt_logprobs


async def first_pieces(model, prompts: list[list[int]], n: int) -> list[bytes]:
    """The first prompt token's piece of each choice (`n` a prompt)."""
    firsts = await pieces.of(model.runner, f"{model.id}@{model.manifest.sha256}", [p[0] for p in prompts])
    return [piece for piece in firsts for _ in range(n)]


def nothing_generated(choices: list) -> None:
    """max_tokens 0: the token the engine sampled to end the prefill is not part of the answer;
    the choice ended for its length, having generated nothing."""
    for choice in choices:
        choice.text.clear()
        choice.logprobs.clear()
        choice.n_generated = 0
        if choice.finish_reason in ("stop", "length"):
            choice.finish_reason = "length"
            choice.stop = None


def _copy(params: SamplingParams) -> SamplingParams:
    out = SamplingParams()
    for name in SAMPLING_FIELDS:
        setattr(out, name, getattr(params, name))
    return out
