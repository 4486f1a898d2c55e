"""The generation parameters of an OpenAI request, validated into one plain object.

Every field is type-checked and bounded; a bad value is a 400 naming the parameter.
Unknown fields are ignored, as OpenAI's SDKs send fields a server may not know.
"""
from __future__ import annotations

from ...engine.core import SamplingParams
from ...serving.request import GenerationParams, seed32 as _seed32
from ...http import validate
from ...http.errors import invalid
from ...chat.gbnf import json_gbnf
from ...chat.grammar import json_schema_grammar
from . import tools as tool_fields

MAX_N = 16
MAX_STOP = 4
MAX_STOP_LEN = 256
MAX_LOGIT_BIAS = 1024
MAX_TOP_LOGPROBS = 20
SEED_RANGE = (-(2 ** 63), 2 ** 63 - 1)

# What a request that leaves sampling unset gets: llama-server's defaults, which keep small
# models coherent (OpenAI's temperature 1 with nothing else turns a 135M model into noise).
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.95
DEFAULT_TOP_K = 40
DEFAULT_MIN_P = 0.05


# ---- the fields, described once: they validate and they are the OpenAPI document ----------

V = validate
MODEL = V.String("model", required=True, max_len=256, doc="The model's id (see GET /v1/models).")
USER = V.String("user", max_len=512, allow_empty=True, doc="The end user's id; not used.")
STOP = V.OneOf(
    "stop", V.String(max_len=MAX_STOP_LEN),
    V.Array(items=V.OneOf("", V.String(max_len=MAX_STOP_LEN),
                          message=f"'stop' entries must be non-empty strings of at most "
                                  f"{MAX_STOP_LEN} characters"), max_items=MAX_STOP),
    doc="Where generation stops (not included in the text).", flat=True,
    message=f"'{{field}}' must be a non-empty string or an array of at most {MAX_STOP} strings "
            f"(non-empty, at most {MAX_STOP_LEN} characters each)")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
RESPONSE_FORMAT = V.Object(
    "response_format",
    V.String("type", choices=RESPONSE_FORMATS),
    V.Object("json_schema", V.String("name", max_len=None, allow_empty=True),
             V.Object("schema", doc="A JSON Schema the output must match."), V.Boolean("strict"),
             message="'response_format.json_schema.schema' must be a JSON Schema object"),
    doc="Constrain the output: any JSON object (json_object) or JSON matching a schema (json_schema).",
    flat=True)


class LogitBias(V.Spec):
    """{token id (as a string): bias from -100 to 100}. The vocabulary bound is the model's."""

    __slots__ = ()

    def check(self, value, path):
        label = V.path_text(path)
        if not isinstance(value, dict):
            raise self.wrong_type(value, path)
        if len(value) > MAX_LOGIT_BIAS:
            raise invalid(f"'{label}' may have at most {MAX_LOGIT_BIAS} entries", label)
        out = []
        for key, bias in value.items():
            try:
                token = int(key)
            except ValueError:
                raise invalid(f"'{label}' keys must be token ids, got {key!r}", label) from None
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
                raise invalid(f"'{label}' values must be numbers from -100 to 100", label)
            out.append((token, float(bias)))
        return out

    def _schema(self) -> dict:
        return {"type": "object", "maxProperties": MAX_LOGIT_BIAS,
                "propertyNames": {"pattern": "^[0-9]+$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}


LOGIT_BIAS = LogitBias("logit_bias", doc="Token id -> bias added to its logit.")
_MAX_TOKENS = 1 << 20
INCLUDE_USAGE = V.Boolean("include_usage")

# Both endpoints' generation fields; parse() reads exactly these lists, and the OpenAPI
# document describes exactly these lists.
COMMON = [
    V.Integer("max_completion_tokens", lo=1, hi=_MAX_TOKENS, doc="Takes precedence over max_tokens."),
    V.Integer("max_tokens", lo=1, hi=_MAX_TOKENS,
              doc="Tokens to generate at most (chat: default until the context is full; "
                  "completions: default 16)."),
    V.Boolean("stream", doc="Send the answer as server-sent events."),
    V.Object("stream_options", doc="Only with stream: true: {include_usage: boolean}."),
    V.Integer("seed", lo=SEED_RANGE[0], hi=SEED_RANGE[1], doc="Makes sampling reproducible."),
    USER,
    V.Number("temperature", lo=0.0, hi=2.0, default=DEFAULT_TEMPERATURE),
    V.Number("top_p", lo=0.0, hi=1.0, default=DEFAULT_TOP_P),
    V.Integer("top_k", lo=0, default=DEFAULT_TOP_K, doc="At most the model's vocabulary size."),
    V.Number("min_p", lo=0.0, hi=1.0, default=DEFAULT_MIN_P),
    V.Number("presence_penalty", lo=-2.0, hi=2.0, default=0.0),
    V.Number("frequency_penalty", lo=-2.0, hi=2.0, default=0.0),
    V.Number("repeat_penalty", lo=0.01, hi=10.0, default=1.0),
    LOGIT_BIAS,
    V.Integer("min_tokens", lo=0, hi=_MAX_TOKENS, default=0),
    V.Boolean("ignore_eos"),
    V.Boolean("speculative", default=True,
              doc="Draftless speculative decoding (prompt lookup) for this request when the "
                  "server has it on (engine.speculative); false opts out. The output is the same "
                  "either way: greedy byte for byte, sampling in distribution."),
    RESPONSE_FORMAT,
    STOP,
    V.Integer("n", lo=1, hi=MAX_N, default=1, doc="Choices to generate."),
]
CHAT = COMMON + [
    V.Boolean("logprobs", doc="Return each generated token's log probability."),
    V.Integer("top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS, default=0,
              doc="Alternatives per token; requires logprobs: true."),
    *tool_fields.FIELDS,
]
SUFFIX = V.String("suffix", max_len=None, allow_empty=True,
                  doc="Text after the insertion (fill-in-the-middle): the prompt is the text before "
                      "it, and the two are put together as llama-server's /infill does; only for "
                      "models with FIM tokens (else a 400).")
# Completions take max_tokens 0 with echo: the prompt's log-probabilities alone (a harness
# scoring a text); completions.py refuses 0 without echo.
COMPLETION_MAX_TOKENS = V.Integer(
    "max_tokens", lo=0, hi=_MAX_TOKENS,
    doc="Tokens to generate at most (default 16); 0 only with echo (the prompt alone, scored with logprobs).")
COMPLETION = [COMPLETION_MAX_TOKENS if spec.name == "max_tokens" else spec for spec in COMMON] + [
    V.Integer("logprobs", lo=0, hi=5,
              doc="Alternatives per token to return log probabilities for; with echo, the "
                  "prompt's tokens get theirs too (the first null)."),
    V.Integer("best_of", lo=1, hi=MAX_N,
              doc="Candidates generated per prompt, at least n; the n with the highest mean log "
                  "probability per token are returned. More than n cannot be streamed."),
    SUFFIX,
]
CHAT_FIELDS = V.Fields(CHAT)
COMPLETION_FIELDS = V.Fields(COMPLETION)


def _grammar(body: dict) -> str:
    response_format = RESPONSE_FORMAT.read(body)
    if response_format is None:
        return ""
    kind = response_format.get("type")
    if kind in (None, "text"):
        return ""
    if kind == "json_object":
        return json_gbnf()
    if kind != "json_schema":
        raise invalid("'response_format.type' must be 'text', 'json_object' or 'json_schema'",
                      "response_format")
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise invalid("'response_format.json_schema.schema' must be a JSON Schema object",
                      "response_format")
    return json_schema_grammar(schema)


def parse(body: dict, *, n_vocab: int, chat: bool) -> GenerationParams:
    """read(), then the bounds that depend on the model's vocabulary."""
    gen = read(body, chat=chat)
    check_vocabulary(gen, n_vocab)
    return gen


def check_vocabulary(gen: GenerationParams, n_vocab: int, top_k: str = "top_k") -> None:
    """The bounds that depend on the model (top_k, logit_bias's token ids), checked once the
    model is known. `top_k`: the field's name in the dialect's body."""
    _at_most(gen.sampling.top_k, n_vocab, top_k)
    _in_vocabulary(gen.sampling.logit_bias, n_vocab)


def read(body: dict, *, chat: bool) -> GenerationParams:
    """The body's generation fields, each read once, checked against the spec's bounds."""
    v = (CHAT_FIELDS if chat else COMPLETION_FIELDS).read(body)
    max_tokens = v["max_completion_tokens"]
    if max_tokens is None:
        max_tokens = v["max_tokens"]
    if max_tokens is None and not chat:
        max_tokens = 16                          # OpenAI's default for completions
    stream = v["stream"]
    if v["stream_options"] is not None and not stream:
        raise invalid("'stream_options' is only allowed with 'stream': true", "stream_options")
    include_usage = INCLUDE_USAGE.read(v["stream_options"] or {})   # param: include_usage

    if chat:
        logprobs = v["logprobs"]
        top_logprobs = v["top_logprobs"]
        if top_logprobs and not logprobs:
            raise invalid("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    else:
        top_logprobs = v["logprobs"]             # legacy: an integer
        logprobs = top_logprobs is not None
        top_logprobs = top_logprobs or 0
    best_of = 0 if chat else _best_of(v["best_of"], v["n"], stream)

    seed = v["seed"]
    s = SamplingParams()
    s.temperature = v["temperature"]
    s.top_p = v["top_p"]
    s.top_k = v["top_k"]
    s.min_p = v["min_p"]
    s.presence_penalty = v["presence_penalty"]
    s.frequency_penalty = v["frequency_penalty"]
    s.repeat_penalty = v["repeat_penalty"]
    s.logit_bias = list(v["logit_bias"] or [])
    s.min_tokens = v["min_tokens"]
    s.ignore_eos = v["ignore_eos"]
    s.speculative = v["speculative"]
    s.logprobs = logprobs or best_of > v["n"]   # the candidates are ranked by their logprobs
    s.n_top_logprobs = top_logprobs
    s.grammar = _grammar(body)
    if seed is not None:
        s.seed = _seed32(seed)

    stop = v["stop"]
    return GenerationParams(
        max_tokens=max_tokens, stop=[stop] if isinstance(stop, str) else (stop or []),
        n=v["n"], stream=stream, include_usage=include_usage, sampling=s, seed=seed,
        top_logprobs=top_logprobs, logprobs=logprobs, grammar=s.grammar, best_of=best_of)


def _best_of(best_of: int | None, n: int, stream: bool) -> int:
    """OpenAI's rules for best_of: at least n, and more than n is not streamed (only the
    winners are known at the end)."""
    if best_of is None:
        return 0
    if best_of < n:
        raise invalid(f"'best_of' must be at least 'n' ({n}), got {best_of}", "best_of")
    if best_of > n and stream:
        raise invalid("'best_of' greater than 'n' cannot be streamed: the best candidates are "
                      "known only once all of them end", "best_of")
    return best_of


def _at_most(value: int, hi: int, name: str) -> int:
    """The bounds that depend on the model, checked after the spec's."""
    if value > hi:
        raise invalid(f"'{name}' must be between 0 and {hi}, got {value}", name)
    return value


def _in_vocabulary(bias: list[tuple[int, float]], n_vocab: int) -> list[tuple[int, float]]:
    for token, _ in bias:
        if not 0 <= token < n_vocab:
            raise invalid(f"'logit_bias' token {token} is outside the vocabulary (0..{n_vocab - 1})",
                          "logit_bias")
    return list(bias)
