"""The generation parameters of an OpenAI request, validated into one plain object.

Every field is type-checked and bounded; a bad value is a 400 naming the parameter.
Unknown fields are ignored, as OpenAI's SDKs send fields a server may not know.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llama_cpp.llama_grammar import JSON_GBNF

from ..engine.native import SAMPLING_FIELDS, SamplingParams
from ..http import validate
from ..http.errors import invalid
from .grammar import json_schema_grammar

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


@dataclass
class Generation:
    max_tokens: int | None          # None: until the context is full
    stop: list[str]
    n: int
    stream: bool
    include_usage: bool
    sampling: SamplingParams
    seed: int | None
    top_logprobs: int               # alternatives per token (0: none)
    logprobs: bool
    grammar: str = ""
    extra: dict = field(default_factory=dict)

    def sampling_for_choice(self, index: int) -> SamplingParams:
        """Choice i of a seeded request uses seed + i: distinct, and reproducible."""
        if index == 0 or self.seed is None:
            return self.sampling
        params = _copy(self.sampling)
        params.seed = _seed32(self.seed + index)
        return params


def _copy(p: SamplingParams) -> SamplingParams:
    q = SamplingParams()
    for name in SAMPLING_FIELDS:
        setattr(q, name, getattr(p, name))
    return q


def _seed32(seed: int) -> int:
    value = seed & 0xFFFFFFFF
    return value if value != 0xFFFFFFFF else 0xFFFFFFFE   # 0xFFFFFFFF means "random" to llama.cpp


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > MAX_STOP:
        raise invalid(f"'stop' must be a string or an array of at most {MAX_STOP} strings", "stop")
    for item in stop:
        if not isinstance(item, str) or not item or len(item) > MAX_STOP_LEN:
            raise invalid(f"'stop' entries must be non-empty strings of at most {MAX_STOP_LEN} "
                          "characters", "stop")
    return stop


def _logit_bias(body: dict, n_vocab: int) -> list[tuple[int, float]]:
    bias = validate.obj(body, "logit_bias", default={})
    if len(bias) > MAX_LOGIT_BIAS:
        raise invalid(f"'logit_bias' may have at most {MAX_LOGIT_BIAS} entries", "logit_bias")
    out = []
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise invalid(f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias") from None
        if not 0 <= token < n_vocab:
            raise invalid(f"'logit_bias' token {token} is outside the vocabulary (0..{n_vocab - 1})",
                          "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise invalid("'logit_bias' values must be numbers from -100 to 100", "logit_bias")
        out.append((token, float(value)))
    return out


def _grammar(body: dict) -> str:
    response_format = validate.obj(body, "response_format")
    if response_format is None:
        return ""
    kind = response_format.get("type")
    if kind in (None, "text"):
        return ""
    if kind == "json_object":
        return JSON_GBNF
    if kind != "json_schema":
        raise invalid("'response_format.type' must be 'text', 'json_object' or 'json_schema'",
                      "response_format")
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise invalid("'response_format.json_schema.schema' must be a JSON Schema object",
                      "response_format")
    return json_schema_grammar(schema)


def parse(body: dict, *, n_vocab: int, chat: bool) -> Generation:
    max_tokens = validate.integer(body, "max_completion_tokens", lo=1, hi=1 << 20)
    if max_tokens is None:
        max_tokens = validate.integer(body, "max_tokens", lo=1, hi=1 << 20)
    if max_tokens is None and not chat:
        max_tokens = 16                          # OpenAI's default for completions
    stream = validate.boolean(body, "stream")
    stream_options = validate.obj(body, "stream_options")
    if stream_options is not None and not stream:
        raise invalid("'stream_options' is only allowed with 'stream': true", "stream_options")
    include_usage = validate.boolean(stream_options or {}, "include_usage")

    if chat:
        logprobs = validate.boolean(body, "logprobs")
        top_logprobs = validate.integer(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS, default=0)
        if top_logprobs and not logprobs:
            raise invalid("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    else:
        top_logprobs = validate.integer(body, "logprobs", lo=0, hi=5)   # legacy: an integer
        logprobs = top_logprobs is not None
        top_logprobs = top_logprobs or 0

    seed = validate.integer(body, "seed", lo=SEED_RANGE[0], hi=SEED_RANGE[1])
    validate.string(body, "user", required=False, max_len=512, allow_empty=True)

    s = SamplingParams()
    s.temperature = validate.number(body, "temperature", lo=0.0, hi=2.0, default=DEFAULT_TEMPERATURE)
    s.top_p = validate.number(body, "top_p", lo=0.0, hi=1.0, default=DEFAULT_TOP_P)
    s.top_k = validate.integer(body, "top_k", lo=0, hi=n_vocab, default=DEFAULT_TOP_K)
    s.min_p = validate.number(body, "min_p", lo=0.0, hi=1.0, default=DEFAULT_MIN_P)
    s.presence_penalty = validate.number(body, "presence_penalty", lo=-2.0, hi=2.0, default=0.0)
    s.frequency_penalty = validate.number(body, "frequency_penalty", lo=-2.0, hi=2.0, default=0.0)
    s.repeat_penalty = validate.number(body, "repeat_penalty", lo=0.01, hi=10.0, default=1.0)
    s.logit_bias = _logit_bias(body, n_vocab)
    s.min_tokens = validate.integer(body, "min_tokens", lo=0, hi=1 << 20, default=0)
    s.ignore_eos = validate.boolean(body, "ignore_eos")
    s.logprobs = logprobs
    s.n_top_logprobs = top_logprobs
    s.grammar = _grammar(body)
    if seed is not None:
        s.seed = _seed32(seed)

    return Generation(
        max_tokens=max_tokens, stop=_stop(body),
        n=validate.integer(body, "n", lo=1, hi=MAX_N, default=1),
        stream=stream, include_usage=include_usage, sampling=s, seed=seed,
        top_logprobs=top_logprobs, logprobs=logprobs, grammar=s.grammar)
