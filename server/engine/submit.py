"""All of a request's choices, or none: one submit for the engine in this process and in a worker.

A request with n choices is n engine requests, submitted in one native call (engine.h,
submit_all): the engine takes their places in its queue and in the key's share under one lock,
every one or none, so a client never gets half an answer, a refused request never holds a slot,
and no other request's submit comes between its choices.

A prompt sent as text (submission.TextJobs) is tokenized and checked against the context here,
where the vocabulary is, and answered in the same verdict: its token count, or why it does not
fit (one exchange with a worker, not a tokenize trip and then a submit).
"""
from __future__ import annotations

from typing import Iterable

VERDICT_BAD_GRAMMAR = -1     # beside the engine's SUBMIT_* verdicts: submit raised ValueError
VERDICT_UNFIT = -2           # a text prompt empty after tokenization, or longer than the context
VERDICT_UNTOKENIZABLE = -3   # the vocabulary could not tokenize the text


def submit_all(engine, jobs: Iterable[tuple], stop: list[str], owner: int) -> tuple[int, str | None]:
    """`jobs`: (request id, prompt tokens, max tokens, SamplingParams). Returns the verdict
    (SUBMIT_ACCEPTED when every job was taken, else the first refused one's, none taken) and,
    for a refused grammar, llama.cpp's words."""
    try:
        return engine.submit_all(list(jobs), stop, owner), None
    except ValueError as exc:                     # a grammar llama.cpp cannot parse
        return VERDICT_BAD_GRAMMAR, str(exc)


def jobs_of_text(engine, text_jobs) -> dict:
    """A TextJobs' jobs, tokenized by `engine`'s vocabulary: {"jobs", "n_prompt"}, or the
    verdict that refuses it ({"verdict", "error", "unfit"})."""
    try:
        made = text_jobs.jobs(engine.tokenize)
    except Exception as exc:                      # never the worker's end: the request's error
        return {"verdict": VERDICT_UNTOKENIZABLE, "error": str(exc)}
    first, second = made
    if not isinstance(first, list):               # (Unfit, message)
        return {"verdict": VERDICT_UNFIT, "error": second, "unfit": first.value}
    return {"jobs": first, "n_prompt": second}


def submit_text(engine, ids: list[int], text_jobs, stop: list[str], owner: int, made: dict | None = None) -> dict:
    """Tokenize (unless `made`, jobs_of_text's answer, is given), check the fit, submit every
    choice or none: the verdict's fields, with the prompt's token count when it was taken."""
    made = made if made is not None else jobs_of_text(engine, text_jobs)
    if "jobs" not in made:
        return made
    verdict, error = submit_all(engine, ((rid, *job) for rid, job in zip(ids, made["jobs"])), stop, owner)
    return {"verdict": verdict, "error": error, "n_prompt": made["n_prompt"]}
