"""All of a request's choices, or none: one submit for the engine in this process and in a worker.

A request with n choices is n engine requests; if the engine refuses one (queue full, over the
key's share, a grammar llama.cpp cannot parse), the ones it took already are cancelled, so a
client never gets half an answer and the refused ones never hold a slot.
"""
from __future__ import annotations

from typing import Iterable

from .core import SUBMIT_ACCEPTED

VERDICT_BAD_GRAMMAR = -1     # beside the engine's SUBMIT_* verdicts: submit raised ValueError


def submit_all(engine, jobs: Iterable[tuple], stop: list[str], owner: int) -> tuple[int, str | None]:
    """`jobs`: (request id, prompt tokens, max tokens, SamplingParams). Returns the verdict
    (SUBMIT_ACCEPTED when every job was taken) and, for a refused grammar, llama.cpp's words."""
    accepted = []
    for rid, prompt, max_tokens, sampling in jobs:
        try:
            verdict, error = engine.submit(rid, prompt, max_tokens, stop, sampling, owner), None
        except ValueError as exc:                 # a grammar llama.cpp cannot parse
            verdict, error = VERDICT_BAD_GRAMMAR, str(exc)
        if verdict != SUBMIT_ACCEPTED:
            for done in accepted:
                engine.cancel(done)
            return verdict, error
        accepted.append(rid)
    return SUBMIT_ACCEPTED, None
