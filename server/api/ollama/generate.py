"""POST /api/generate: a prompt answered as Ollama answers it. Through the model's chat template
(with `system` as the system turn) unless `raw`, which sends the prompt as written; with a
`suffix`, the prompt and the suffix as fill-in-the-middle, built as /infill builds it. An empty
prompt only loads the model (keep_alive 0: unloads it). Streamed as NDJSON by default.

The template path is the chat pipeline's (serving's ChatRequest, chat.start); raw and suffix
prompts are token prompts, submitted as /v1/completions submits them.
"""
from __future__ import annotations

import contextlib
import time

from ...errors import DomainError
from ...http.errors import ApiError, invalid
from ...http.response import Response, StreamingResponse, json_response
from ...serving.output import REASONING, TEXT
from ...serving.request import ChatRequest
from ..errors import answer_of
from ..inference import chat as openai_chat
from ..inference import generate as gen_jobs
from ..inference import infill, params
from ..inference.responses import Choice
from . import loading, names, options as opts, timing
from .chat import FIELD_NAMES, NDJSON, line, no_images, refuse_logprobs
from .errors import error_line
from .timing import head


def text_field(body: dict, name: str) -> str:
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid(f"'{name}' must be a string", name)
    return value


def refuse_unsupported(body: dict) -> None:
    no_images(body.get("images"), "images")
    refuse_logprobs(body)
    if body.get("template"):
        raise invalid("'template' is not supported: the model's own chat template is used "
                      "('raw': true sends the prompt as written)", "template")
    if body.get("context"):
        raise invalid("'context' (the token ids of an earlier answer) is not supported: send the "
                      "conversation to /api/chat", "context")


async def generate(ctx, request) -> Response | StreamingResponse:
    started = time.monotonic_ns()
    body = request.json()
    model_id = loading.resolve(ctx, body)
    options = opts.read_options(body)
    keep_alive = opts.keep_alive_of(body)
    prompt, suffix, system = text_field(body, "prompt"), text_field(body, "suffix"), text_field(body, "system")
    raw = body.get("raw")
    if raw is not None and not isinstance(raw, bool):
        raise invalid("'raw' must be a boolean", "raw")
    refuse_unsupported(body)
    grammar, effort = opts.grammar_of(body), opts.effort_of(body)
    gen = opts.generation(options, grammar, opts.stream_of(body))
    model_name = names.shown(model_id)
    if not prompt and not suffix:              # Ollama's way to load (keep_alive 0: unload) a model
        done = await loading.load_only(ctx, model_id, options.get("num_ctx"), keep_alive, started)
        return json_response({**head(model_name), "response": "", **done})
    got = await loading.model_for(ctx, model_id, "chat", options.get("num_ctx"), keep_alive)
    opts.apply_window(gen, options, got.model.context_length)
    if raw or suffix:
        if system:
            raise invalid("'system' needs the chat template: it cannot be combined with "
                          f"'{'raw' if raw else 'suffix'}'", "system")
        choices = await submit_tokens(ctx, request, model_id, gen, prompt, suffix)
        if gen.stream:
            return StreamingResponse(token_lines(choices, model_name, started, got.load_ns), NDJSON)
        return json_response(await token_whole(choices, model_name, started, got.load_ns))
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    run = await openai_chat.start(ctx, request, ChatRequest(model_id, messages, gen, None, effort,
                                                            {**FIELD_NAMES, "messages": "prompt"}))
    if gen.stream:
        return StreamingResponse(chat_lines(run, model_name, started, got.load_ns), NDJSON)
    (message,) = await run.result()
    answer = {**head(model_name), "response": message.content or "", "done": True,
              "done_reason": timing.done_reason(message.finish)}
    if message.reasoning:
        answer["thinking"] = message.reasoning
    return json_response({**answer, **timing.final_fields(run.choices[0], started, got.load_ns)})


async def chat_lines(run, model_name: str, started: int, load_ns: int):
    finish = None
    try:
        async with contextlib.aclosing(run.steps()) as steps:
            async for step in steps:
                for piece in step.pieces:
                    if piece.kind == TEXT and piece.text:
                        yield line({**head(model_name), "response": piece.text, "done": False})
                    elif piece.kind == REASONING and piece.text:
                        yield line({**head(model_name), "response": "", "thinking": piece.text, "done": False})
                if step.finish is not None:
                    finish = step.finish
        yield line({**head(model_name), "response": "", "done": True, "done_reason": timing.done_reason(finish),
                    **timing.final_fields(run.choices[0], started, load_ns)})
    except (ApiError, DomainError) as exc:
        yield line(error_line(answer_of(exc)))


# ---- raw and fill-in-the-middle prompts: token prompts ----------------------------------------

class TokenRun:
    __slots__ = ("model", "stream", "choices")

    def __init__(self, model, stream):
        self.model, self.stream = model, stream
        self.choices = None


async def submit_tokens(ctx, request, model_id: str, gen, prompt: str, suffix: str) -> TokenRun:
    async def submit():
        model = await ctx.models.get(model_id, "chat")
        params.check_vocabulary(gen, model.engine.n_vocab, "options.top_k")
        if suffix:
            tokens = await infill.prompt_for(ctx, model, prompt, suffix, [], "", "suffix")
        else:
            (tokens,) = await gen_jobs.tokenized(model, [prompt], request, True, True,
                                                 lambda i: invalid("'prompt' is not valid", "prompt"))
        gen_jobs.check_fits(len(tokens), model.context_length)
        gen_jobs.check_share(ctx, model, 1)
        stream = await model.runner.generate(gen_jobs.jobs_for([tokens], gen, model.context_length),
                                             gen.stop, gen_jobs.owner_of(request))
        return TokenRun(model, stream)

    return await ctx.models.hold.across(model_id, submit)


async def token_whole(run: TokenRun, model_name: str, started: int, load_ns: int) -> dict:
    (choice,) = await gen_jobs.collect(run.model.runner, run.stream, 1)
    return {**head(model_name), "response": choice.joined(), "done": True,
            "done_reason": timing.done_reason(choice.finish_reason),
            **timing.final_fields(choice, started, load_ns)}


async def token_lines(run: TokenRun, model_name: str, started: int, load_ns: int):
    choices = [Choice()]
    try:
        async with contextlib.aclosing(gen_jobs.follow(run.model.runner, run.stream, choices)) as events:
            async for _, choice, event in events:
                text = event.text.decode("utf-8", "replace")
                if text:
                    yield line({**head(model_name), "response": text, "done": False})
        choice = choices[0]
        yield line({**head(model_name), "response": "", "done": True,
                    "done_reason": timing.done_reason(choice.finish_reason),
                    **timing.final_fields(choice, started, load_ns)})
    except (ApiError, DomainError) as exc:
        yield line(error_line(answer_of(exc)))
