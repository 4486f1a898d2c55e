"""What chat and completions share: turning prompts into engine jobs, collecting results,
and the context-length rules."""
from __future__ import annotations

import math

from ...engine.submission import Unfit, fit_error, room
from ...runtime.runner import Generation, Resubmitted
from ...system import offload
from ...http.errors import ApiError, ErrorKind, invalid
from . import params as gen_params
from ..errors import of_event
from .responses import Choice


# Token arrays in bodies up to this size are checked on the loop (microseconds); larger ones on
# an offload thread (offload.py), so 2,048 embedding inputs never stall the other clients. The
# texts go to the model's runner, whose worker tokenizes them (runner.tokenize).
OFF_LOOP_BYTES = 16 * 1024


async def tokenized(model, items: list, request, add_special: bool, parse_special: bool,
                    outside_vocabulary) -> list[list[int]]:
    """`items` (strings and token arrays) as token lists: the strings tokenized in one call,
    the arrays checked against the vocabulary first (`outside_vocabulary(i)`: the error for
    item i)."""
    n_vocab = model.engine.n_vocab

    def check() -> None:
        for i, item in enumerate(items):
            if not isinstance(item, str) and not all(t < n_vocab for t in item):
                raise outside_vocabulary(i)

    if len(request.body) <= OFF_LOOP_BYTES:
        check()
    else:
        await offload.run(check)
    texts = [item for item in items if isinstance(item, str)]
    tokens = iter(await model.runner.tokenize(texts, add_special, parse_special))
    return [next(tokens) if isinstance(item, str) else list(item) for item in items]


def owner_of(request) -> int:
    """Who a request counts against for the fair share of a model: its API key."""
    key = getattr(request, "key", None)
    return hash(key.id) if key is not None else 0


def check_fits(n_prompt: int, context_length: int, what: str = "prompt") -> None:
    """A prompt of token ids checked as the worker checks a text prompt (submission.fit_error)."""
    unfit = fit_error(n_prompt, context_length, what)
    if unfit is None:
        return
    kind = ErrorKind.CONTEXT_LENGTH_EXCEEDED if unfit[0] is Unfit.TOO_LONG else ErrorKind.INVALID_REQUEST
    raise ApiError(kind, unfit[1], param="messages" if what == "messages" else "prompt")


def check_share(ctx, model, n_jobs: int, param: str = "n") -> None:
    """A request no key could ever be admitted with is a 400 that says why, not a 429 an SDK
    retries for ever. Each choice of each prompt takes a place in the model's queue first, and
    a key holds at most key_share of the queue and slots together (the engine's share_of)."""
    config = ctx.models.config
    places = config.max_queue + model.runner.engine.n_slots
    most = min(config.max_queue, max(1, min(places, math.floor(config.key_share * places))))
    if n_jobs > most:
        raise invalid(f"this request asks for {n_jobs} generations ({param} times the prompts); one "
                      f"API key may hold at most {most} of this model's at once "
                      f"(inference.limits.key_share of engine.max_queue and engine.slots)", param)


def jobs_for(prompts: list[list[int]], gen: gen_params.GenerationParams, context_length: int) -> list:
    """One job per candidate: prompt p's j-th is job p * candidates + j (candidates: n, or a
    completion's best_of). Generation stops at the context's end (finish_reason "length") when
    max_tokens would pass it."""
    jobs = []
    for prompt in prompts:
        max_tokens = room(len(prompt), gen.max_tokens, context_length)
        for j in range(gen.candidates):
            jobs.append((prompt, max_tokens, gen.sampling_for_choice(j)))
    return jobs


async def follow(runner, stream: Generation, choices: list[Choice]):
    """Yield (index, choice, event) as events arrive, recording each into its choice. Raises
    ApiError if the engine fails a request. Whatever ends the consumer (the last event, an
    error, a client that went away) frees the request's slots."""
    try:
        async for event in stream:
            index = stream.choice[event.id_request]
            choice = choices[index]
            choice.add(event)
            if failed(choice):
                raise of_event(choice.error)
            yield index, choice, event
    finally:
        runner.cancel(stream)            # no-op once every choice has finished


async def collect(runner, stream: Generation, n_choices: int) -> list[Choice]:
    """Every choice whole, for an answer sent at the end. Nothing has reached the client before
    then, so a request whose engine is lost midway (its worker died, its replica's node went
    down) is submitted again and gathered anew, where the engine allows it (Resubmitted)."""
    choices = [Choice() for _ in range(n_choices)]
    if isinstance(stream, Resubmitted):
        def start_over() -> None:
            choices[:] = [Choice() for _ in range(n_choices)]
        stream.start_over = start_over
    async for _ in follow(runner, stream, choices):
        pass
    return choices


def failed(choice: Choice) -> bool:
    return choice.finish_reason in ("error", "abort")

