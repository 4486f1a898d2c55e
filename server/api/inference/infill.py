"""Fill-in-the-middle: POST /infill (llama-server's fields and answer, what llama.vim and other
editor plugins send) and the prompts of /v1/completions with a `suffix`. The prompt is built as
llama-server builds it (chat/infill.py), for models whose vocabulary has FIM tokens; another
model's request is a 400 naming the field that asked for it."""
from __future__ import annotations

import contextlib

from ...errors import DomainError
from ...http import validate as V
from ...http.errors import ApiError, invalid
from ...http.response import Response, StreamingResponse, json_response
from ...observe.timings import timings
from ...store import gguf_check
from ...store.defaults import CHAT_MODEL
from ...system import offload
from ...chat import infill as fim
from ..errors import answer_of
from . import generate, params, responses
from ...serving.request import GenerationParams, plain_generation, plain_sampling

MAX_EXTRA = 1024                   # input_extra chunks

MIXED = V.OneOf("", V.String(max_len=None, allow_empty=True),
                V.Array(items=V.OneOf("", V.String(max_len=None, allow_empty=True), V.Integer(lo=0),
                                      message="entries must be strings or token ids")),
                message="'{field}' must be a string or an array of strings and token ids")
EXTRA_CHUNK = V.Object("", V.String("text", required=True, max_len=None, allow_empty=True),
                       V.String("filename", max_len=4096, allow_empty=True),
                       message="'{field}' must be an object {{\"text\": string, \"filename\": string}}")
FIELDS = [
    V.String("model", max_len=256, doc="The model's id; default the most recently loaded chat model."),
    V.OneOf("input_prefix", *MIXED.choices, required=True, message=MIXED.message,
            doc="The text before the cursor (a string, or strings and token ids)."),
    V.OneOf("input_suffix", *MIXED.choices, required=True, message=MIXED.message,
            doc="The text after the cursor."),
    V.Array("input_extra", EXTRA_CHUNK, max_items=MAX_EXTRA,
            doc="Other files of the project for context: [{\"filename\", \"text\"}], most relevant last."),
    V.String("prompt", max_len=None, allow_empty=True, doc="Text after the prefix (the cursor's line)."),
    V.Integer("n_predict", lo=-1, hi=1 << 20, default=-1, doc="Tokens to generate at most; -1: until the context ends."),
    V.Number("temperature", lo=0.0, hi=2.0, default=params.DEFAULT_TEMPERATURE),
    V.Number("top_p", lo=0.0, hi=1.0, default=params.DEFAULT_TOP_P),
    V.Integer("top_k", lo=0, default=params.DEFAULT_TOP_K),
    V.Number("min_p", lo=0.0, hi=1.0, default=params.DEFAULT_MIN_P),
    V.Number("repeat_penalty", lo=0.01, hi=10.0, default=1.0),
    V.Number("presence_penalty", lo=-2.0, hi=2.0, default=0.0),
    V.Number("frequency_penalty", lo=-2.0, hi=2.0, default=0.0),
    V.Integer("seed", lo=-1, hi=params.SEED_RANGE[1], doc="-1: random."),
    params.STOP,
    V.Boolean("stream", doc="Server-sent events, llama-server's: {content, stop} each."),
    V.Array("response_fields", V.String(max_len=256), max_items=64,
            doc="Only these fields in the answer, each a path into it (`timings/prompt_n`), as "
                "llama-server answers them (llama.vim asks so)."),
]
READ = V.Fields(FIELDS)


def generation_of(v: dict, context_length: int, n_vocab: int) -> GenerationParams:
    """The fields as read, as one choice's generation: n_predict -1 (or 0) is until the
    context ends, a seed of -1 random, as llama-server takes them."""
    s = plain_sampling(temperature=v["temperature"], top_p=v["top_p"], top_k=v["top_k"], min_p=v["min_p"],
                       seed=v["seed"] if v["seed"] is not None and v["seed"] >= 0 else None)
    s.repeat_penalty, s.presence_penalty = v["repeat_penalty"], v["presence_penalty"]
    s.frequency_penalty = v["frequency_penalty"]
    stop = v["stop"]
    gen = plain_generation(s, max_tokens=v["n_predict"] if v["n_predict"] > 0 else context_length,
                           stop=[stop] if isinstance(stop, str) else (stop or []), stream=bool(v["stream"]))
    params.check_vocabulary(gen, n_vocab)
    return gen

_known: dict[str, fim.FimTokens] = {}      # model digest -> its FIM tokens


async def fim_tokens(ctx, model) -> fim.FimTokens:
    """The model's FIM tokens as llama.cpp finds them: declared in the GGUF, else recognised by
    their text. Read once per model file."""
    digest = model.manifest.sha256
    found = _known.get(digest)
    if found is None:
        path = ctx.models.store.model_path(model.manifest)
        declared = await offload.run(_declared, path, model.engine.n_vocab)
        found = await fim.fim_tokens(declared, model.runner.tokenize)
        _known[digest] = found
    return found


def _declared(path: str, n_vocab: int) -> dict[str, int]:
    out: dict[str, int] = {}

    def read(meta) -> None:
        for role, keys in fim.DECLARED.items():
            for key in keys:
                if meta.type_name(key) in ("uint32", "int32") and 0 <= meta.scalar(key) < n_vocab:
                    out.setdefault(role, meta.scalar(key))

    gguf_check.check_gguf(path, extra_checks=(read,))
    return out


async def prompt_for(ctx, model, prefix, suffix, extra: list[dict], prompt: str, field: str) -> list[int]:
    """The infill prompt's tokens, or a 400 naming `field` when the model has no FIM tokens."""
    tokens = await fim_tokens(ctx, model)
    missing = tokens.missing()
    if missing:
        raise invalid(f"'{field}' asks for fill-in-the-middle, but this model's vocabulary has no FIM "
                      f"{', '.join(missing)} token (its GGUF declares none: "
                      f"tokenizer.ggml.fim_{missing[0]}_token_id)", field)
    n_vocab = model.engine.n_vocab
    for name, value in (("input_prefix", prefix), ("input_suffix", suffix)):
        if not isinstance(value, str) and any(isinstance(t, int) and t >= n_vocab for t in value):
            raise invalid(f"'{name}' holds a token id outside the vocabulary (0..{n_vocab - 1})", name)
    return await fim.prompt_tokens(tokens, model.runner.tokenize, prefix, suffix, extra, prompt,
                                   model.context_length)


async def infill(ctx, request) -> Response | StreamingResponse:
    v = READ.read(request.json())
    model_id = v["model"] or ctx.models.active_chat_model() or CHAT_MODEL

    async def submit():
        model = await ctx.models.get(model_id, "chat")
        gen = generation_of(v, model.context_length, model.engine.n_vocab)
        prompt = await prompt_for(ctx, model, v["input_prefix"], v["input_suffix"], v["input_extra"] or [],
                                  v["prompt"] or "", "input_prefix")
        generate.check_fits(len(prompt), model.context_length)
        generate.check_share(ctx, model, 1)
        stream = await model.runner.generate(generate.jobs_for([prompt], gen, model.context_length),
                                             gen.stop, generate.owner_of(request))
        return model, gen, prompt, stream

    model, gen, prompt, stream = await ctx.models.hold.across(model_id, submit)
    if gen.stream:
        return StreamingResponse(_events(model, gen, stream), b"text/event-stream")
    (choice,) = await generate.collect(model.runner, stream, 1)
    answer = _final(model, gen, choice, choice.joined())
    return json_response(answer if v["response_fields"] is None else _picked(answer, v["response_fields"]))


def _picked(answer: dict, paths: list[str]) -> dict:
    """llama-server's response_fields: {path: the value at that path} for the paths found."""
    out = {}
    for path in paths:
        value, found = answer, True
        for part in path.split("/"):
            if isinstance(value, dict) and part in value:
                value = value[part]
            else:
                found = False
                break
        if found:
            out[path] = value
    return out


def _final(model, gen, choice: responses.Choice, content: str) -> dict:
    """llama-server's answer to /infill (its own shape, not OpenAI's)."""
    stop_type = {"stop": "word" if choice.stop is not None else "eos", "length": "limit"}.get(
        choice.finish_reason, "none")
    return {"index": 0, "content": content, "tokens": [], "id_slot": -1, "stop": True, "model": model.id,
            "tokens_predicted": choice.n_generated, "tokens_evaluated": choice.n_prompt,
            "tokens_cached": choice.n_cached, "truncated": False, "has_new_line": "\n" in content,
            "stop_type": stop_type, "stopping_word": choice.stop or "",
            "timings": timings([choice], [0])}


async def _events(model, gen, stream):
    choices = [responses.Choice()]
    try:
        async with contextlib.aclosing(generate.follow(model.runner, stream, choices)) as events:
            async for _, choice, event in events:
                text = event.text.decode("utf-8", "replace")
                if choice.finish_reason is None:
                    if text:
                        yield responses.sse({"index": 0, "content": text, "tokens": [], "stop": False,
                                             "id_slot": -1, "tokens_predicted": choice.n_generated,
                                             "tokens_evaluated": choice.n_prompt})
                else:
                    yield responses.sse(_final(model, gen, choice, text))
    except (ApiError, DomainError) as exc:   # the head is sent: report in the stream, then end it
        yield responses.sse(answer_of(exc).body())
