"""POST /v1/completions."""
from __future__ import annotations

import contextlib

from ...http import validate
from ...http.errors import ApiError, invalid
from ...http.response import Response, StreamingResponse, json_response
from ...errors import DomainError
from ...observe.timings import timings
from ..errors import answer_of
from ...chat import echo_logprobs
from . import generate, infill, params, responses

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
ECHO = validate.Boolean("echo", doc="Put the prompt before the completion; with logprobs, the "
                                    "prompt's tokens get theirs too.")
# echo with logprobs: the log-probability rows a request may ask for (each prompt's tokens, once
# per choice). The engine computes a prompt's rows once, in its prefill; the bound keeps the
# answer (every row with its alternatives) to a few megabytes.
MAX_PROMPT_LOGPROB_ROWS = 16384


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
        if gen.max_tokens == 0 and not echo:
            raise invalid("'max_tokens' may be 0 only with 'echo': true (the prompt alone)", "max_tokens")
        suffix = params.SUFFIX.read(body)
        if suffix and echo:
            raise invalid("'echo' cannot be combined with 'suffix'", "echo")
        if suffix:                            # fill-in-the-middle: prompt, suffix as /infill puts them
            prompts = [await infill.prompt_for(ctx, model, item, suffix, [], "", "suffix")
                       for item in prompts_of(body)]
        else:
            prompts = await generate.tokenized(model, prompts_of(body), request, True, True,
                                               lambda i: invalid(_PROMPT_ENTRY, "prompt"))
        for prompt in prompts:
            generate.check_fits(len(prompt), model.context_length)
        generate.check_share(ctx, model, len(prompts) * gen.candidates,
                             "best_of" if gen.candidates > gen.n else "n")
        scored = echo and gen.logprobs
        if scored:
            _check_prompt_rows(prompts, gen.n)
        # echo's texts (and first pieces) before the work starts, so that nothing can fail between
        prefixes = await _echo_texts(model.runner, prompts, gen.n) if echo else None
        firsts = await echo_logprobs.first_pieces(model, prompts, gen.n) if scored else None
        jobs = generate.jobs_for(prompts, gen, model.context_length)
        if gen.max_tokens == 0:               # the engine samples one token: not shown
            jobs = [(prompt, 1, sampling) for prompt, _, sampling in jobs]
        if scored:
            # streamed, every choice brings its own (its prompt goes out with its first token)
            jobs = echo_logprobs.scoring(jobs, 1 if gen.stream else gen.candidates)
        stream = await model.runner.generate(jobs, gen.stop, generate.owner_of(request))
        return model, gen, prompts, prefixes, firsts, stream

    model, gen, prompts, prefixes, firsts, stream = await ctx.models.hold.across(model_id, submit)
    head = responses.envelope("text_completion", responses.new_id("cmpl"), model.id)
    if gen.stream:                          # best_of is n here (params._best_of)
        return StreamingResponse(_chunks(model.runner, stream, gen, head, len(prompts) * gen.n, prefixes,
                                         firsts), b"text/event-stream")

    generated = await generate.collect(model.runner, stream, len(prompts) * gen.candidates)
    prompts_counted = list(range(0, len(generated), gen.candidates))
    if firsts is not None:
        echo_logprobs.share_rows(generated, gen.candidates)
    if gen.max_tokens == 0:
        echo_logprobs.nothing_generated(generated)
    choices = best_of(generated, gen.candidates, gen.n)
    prefixes = prefixes or [""] * len(choices)
    head["choices"] = [{
        "text": prefixes[i] + c.joined(),
        "index": i,
        "logprobs": responses.completion_logprobs(
            c.logprobs, 0 if firsts else len(prefixes[i]),
            (firsts[i], c.prompt_logprobs) if firsts else None) if gen.logprobs else None,
        "finish_reason": c.finish_reason, **responses.stop_field(c, gen.stop),
    } for i, c in enumerate(choices)]
    head["usage"] = responses.usage(generated, prompts_counted)   # every candidate's tokens
    head["timings"] = timings(generated, prompts_counted)
    return json_response(head)


def _check_prompt_rows(prompts: list[list[int]], n: int) -> None:
    rows = sum(map(len, prompts)) * n
    if rows > MAX_PROMPT_LOGPROB_ROWS:
        raise invalid(f"'echo' with 'logprobs' answers at most {MAX_PROMPT_LOGPROB_ROWS} prompt tokens' "
                      f"log probabilities per request (the prompts' tokens times n); this one asks "
                      f"for {rows}", "echo")


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
                  prefixes: list[str] | None, firsts: list[bytes] | None):
    """`firsts` (echo with logprobs): a choice's prompt goes out with its log-probabilities once
    the engine has them, with the choice's first token; else every prompt goes out first."""
    usage_field = {"usage": None} if gen.include_usage else {}
    choices = [responses.Choice() for _ in range(n_choices)]
    prompts_counted = list(range(0, n_choices, gen.n))
    n_open = n_choices
    echoed = [firsts is None] * n_choices
    try:
        for index, prefix in enumerate(prefixes if prefixes and firsts is None else ()):   # echo: each prompt first
            yield responses.sse({**head, "choices": [{"text": prefix, "index": index, "logprobs": None,
                                                      "finish_reason": None}], **usage_field})
        async with contextlib.aclosing(generate.follow(runner, stream, choices)) as events:
            async for index, choice, event in events:
                if not echoed[index]:
                    echoed[index] = True
                    yield responses.sse({**head, "choices": [{
                        "text": prefixes[index], "index": index, "finish_reason": None,
                        "logprobs": responses.completion_logprobs(
                            [], 0, (firsts[index], choice.prompt_logprobs))}], **usage_field})
                text, entries = event.text, event.logprobs
                if gen.max_tokens == 0:           # the one token sampled is not shown
                    echo_logprobs.nothing_generated([choice])
                    text, entries = b"", None
                logprobs = responses.completion_logprobs(entries) if gen.logprobs and entries else None
                extra = {}
                if choice.finish_reason is not None:
                    n_open -= 1
                    if n_open == 0 and not gen.include_usage:   # the timings go in the last chunk
                        extra = {"timings": timings(choices, prompts_counted)}
                yield responses.sse({**head, "choices": [{
                    "text": text.decode("utf-8", "replace"), "index": index,
                    "logprobs": logprobs, "finish_reason": choice.finish_reason,
                    **responses.stop_field(choice, gen.stop)}], **usage_field,
                    **extra})
        if gen.include_usage:
            yield responses.sse({**head, "choices": [], "usage": responses.usage(choices, prompts_counted),
                                 "timings": timings(choices, prompts_counted)})
        yield responses.SSE_DONE
    except (ApiError, DomainError) as exc:   # the head is sent: report in the stream, then end it
        yield responses.sse(answer_of(exc).body())
