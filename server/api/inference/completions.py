"""POST /v1/completions."""
from __future__ import annotations

import contextlib

from ...http import validate
from ...http.errors import ApiError, invalid
from ...http.response import Response, StreamingResponse, json_response
from ...errors import DomainError
from ...observe.timings import timings
from ..errors import answer_of
from . import generate, params, responses

MAX_PROMPTS = 64


_PROMPT_ENTRY = "'prompt' entries must be strings or arrays of token ids in the vocabulary"
PROMPT = validate.OneOf(
    "prompt", validate.String(max_len=None, allow_empty=True), validate.Tokens(),
    validate.Array(items=validate.OneOf("", validate.String(max_len=None, allow_empty=True),
                                        validate.Tokens(), message=_PROMPT_ENTRY),
                   min_items=1, max_items=MAX_PROMPTS),
    required=True, flat=True,
    doc="A string, an array of strings, a token array, or an array of token arrays.",
    message="'prompt' must be a string, an array of strings, or token arrays")
ECHO = validate.Boolean("echo", doc="Put the prompt before the completion.")


def prompts_of(body: dict) -> list:
    """A string, a list of strings, a token array, or a list of token arrays (PROMPT), as a list."""
    prompt = PROMPT.read(body)
    return [prompt] if isinstance(prompt, str) or validate.is_tokens(prompt) else prompt


async def completions(ctx, request) -> Response | StreamingResponse:
    body = request.json()
    model_id = params.MODEL.read(body)
    echo = ECHO.read(body)

    async def submit():
        model = await ctx.models.get(model_id, "chat")
        gen = params.parse(body, n_vocab=model.engine.n_vocab, chat=False)
        prompts = await generate.tokenized(model, prompts_of(body), request, True, True,
                                           lambda i: invalid(_PROMPT_ENTRY, "prompt"))
        for prompt in prompts:
            generate.check_fits(len(prompt), model.context_length)
        generate.check_share(ctx, model, len(prompts) * gen.candidates,
                             "best_of" if gen.candidates > gen.n else "n")
        # echo's texts before the work starts, so that nothing can fail between the two
        prefixes = await _echo_texts(model.runner, prompts, gen.n) if echo else None
        stream = await model.runner.generate(generate.jobs_for(prompts, gen, model.context_length),
                                             gen.stop, generate.owner_of(request))
        return model, gen, prompts, prefixes, stream

    model, gen, prompts, prefixes, stream = await generate.across_a_restart(ctx, model_id, submit)
    head = responses.envelope("text_completion", responses.new_id("cmpl"), model.id)
    if gen.stream:                          # best_of is n here (params._best_of)
        return StreamingResponse(_chunks(model.runner, stream, gen, head, len(prompts) * gen.n, prefixes),
                                 b"text/event-stream")

    generated = await generate.collect(model.runner, stream, len(prompts) * gen.candidates)
    prompts_counted = list(range(0, len(generated), gen.candidates))
    choices = best_of(generated, gen.candidates, gen.n)
    prefixes = prefixes or [""] * len(choices)
    head["choices"] = [{
        "text": prefixes[i] + c.joined(),
        "index": i,
        "logprobs": responses.completion_logprobs(c.logprobs, len(prefixes[i])) if gen.logprobs else None,
        "finish_reason": c.finish_reason, **responses.stop_field(c, gen.stop),
    } for i, c in enumerate(choices)]
    head["usage"] = responses.usage(generated, prompts_counted)   # every candidate's tokens
    head["timings"] = timings(generated, prompts_counted)
    return json_response(head)


def best_of(generated: list, candidates: int, n: int) -> list:
    """Of each prompt's `candidates` choices, the `n` with the highest mean log probability per
    generated token (OpenAI's `best_of`), best first; all of them, in order, when there are no
    more candidates than n."""
    if candidates == n:
        return generated
    chosen = []
    for start in range(0, len(generated), candidates):
        group = generated[start:start + candidates]
        group.sort(key=_mean_logprob, reverse=True)      # stable: ties keep their order
        chosen.extend(group[:n])
    return chosen


def _mean_logprob(choice) -> float:
    entries = choice.logprobs
    return sum(logprob for _, logprob, _, _ in entries) / len(entries) if entries else 0.0


async def _echo_texts(runner, prompts: list[list[int]], n: int) -> list[str]:
    """Each choice's prompt as text (`n` choices a prompt), for echo."""
    texts = [(await runner.detokenize(prompt)).decode("utf-8", "replace") for prompt in prompts]
    return [text for text in texts for _ in range(n)]


async def _chunks(runner, stream, gen: params.GenerationParams, head: dict, n_choices: int,
                  prefixes: list[str] | None):
    usage_field = {"usage": None} if gen.include_usage else {}
    choices = [responses.Choice() for _ in range(n_choices)]
    prompts_counted = list(range(0, n_choices, gen.n))
    n_open = n_choices
    try:
        for index, prefix in enumerate(prefixes or ()):   # echo: each choice's prompt first
            yield responses.sse({**head, "choices": [{"text": prefix, "index": index, "logprobs": None,
                                                      "finish_reason": None}], **usage_field})
        async with contextlib.aclosing(generate.follow(runner, stream, choices)) as events:
            async for index, choice, event in events:
                entries = event.logprobs
                logprobs = responses.completion_logprobs(entries) if gen.logprobs and entries else None
                extra = {}
                if choice.finish_reason is not None:
                    n_open -= 1
                    if n_open == 0 and not gen.include_usage:   # the timings go in the last chunk
                        extra = {"timings": timings(choices, prompts_counted)}
                yield responses.sse({**head, "choices": [{
                    "text": event.text.decode("utf-8", "replace"), "index": index,
                    "logprobs": logprobs, "finish_reason": choice.finish_reason,
                    **responses.stop_field(choice, gen.stop)}], **usage_field,
                    **extra})
        if gen.include_usage:
            yield responses.sse({**head, "choices": [], "usage": responses.usage(choices, prompts_counted),
                                 "timings": timings(choices, prompts_counted)})
        yield responses.SSE_DONE
    except (ApiError, DomainError) as exc:   # the head is sent: report in the stream, then end it
        yield responses.sse(answer_of(exc).body())
