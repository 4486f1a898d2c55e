"""Ollama's generation fields (`options`, `format`, `think`, `keep_alive`) as the typed request.

Every option Ollama documents is either applied, accepted because it changes nothing here, or
refused with a 400 that names it: a client never believes a setting took effect when it did not.
  applied    temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty,
             presence_penalty, frequency_penalty, repeat_last_n, num_ctx (the model's context,
             as a load sets it: see context_of)
  accepted   num_keep (stackd never drops prompt tokens to make room: a prompt that does not
             fit is a 400, so every token is kept), and the machine's knobs an operator sets in
             stackd's own settings (num_thread, num_gpu, main_gpu, num_batch, use_mmap,
             use_mlock, numa, low_vram): clients send them by default
  refused    the samplers llama.cpp's engine here does not run (mirostat, tfs_z, typical_p,
             penalize_newline) unless set to their neutral value, and any other key
"""
from __future__ import annotations

from ...chat.gbnf import json_gbnf
from ...chat.grammar import json_schema_grammar
from ...engine.core import SamplingParams
from ...http import validate as V
from ...http.errors import invalid
from ...serving.request import GenerationParams, seed32
from ...system import durations
from ..inference import params

MAX_STOP = 16              # Continue's autocomplete sends a dozen stops
MAX_PREDICT = 1 << 20      # as chat's max_tokens

APPLIED = {
    "temperature": V.Number("temperature", lo=0.0, hi=2.0),
    "top_p": V.Number("top_p", lo=0.0, hi=1.0),
    "top_k": V.Integer("top_k", lo=0),
    "min_p": V.Number("min_p", lo=0.0, hi=1.0),
    "seed": V.Integer("seed", lo=params.SEED_RANGE[0], hi=params.SEED_RANGE[1]),
    "num_predict": V.Integer("num_predict", lo=-2, hi=MAX_PREDICT),
    "num_ctx": V.Integer("num_ctx", lo=1, hi=1 << 24),
    # an array, or one string (Continue's provider types it string | string[])
    "stop": V.OneOf("stop", V.String(max_len=params.MAX_STOP_LEN),
                    V.Array(items=V.String(max_len=params.MAX_STOP_LEN), max_items=MAX_STOP), flat=True,
                    message=f"'{{field}}' must be a string or an array of at most {MAX_STOP} strings "
                            f"(non-empty, at most {params.MAX_STOP_LEN} characters each)"),
    "repeat_penalty": V.Number("repeat_penalty", lo=0.01, hi=10.0),
    "presence_penalty": V.Number("presence_penalty", lo=-2.0, hi=2.0),
    "frequency_penalty": V.Number("frequency_penalty", lo=-2.0, hi=2.0),
    "repeat_last_n": V.Integer("repeat_last_n", lo=-1, hi=1 << 24),
    "num_keep": V.Integer("num_keep", lo=-1, hi=1 << 24),
}
# the machine's knobs: stackd's settings (engine.threads, engine.batch, ...) decide them
MACHINE = ("num_thread", "num_gpu", "main_gpu", "num_batch", "use_mmap", "use_mlock", "numa",
           "low_vram", "f16_kv", "vocab_only", "logits_all", "embedding_only")
# samplers not run here: accepted only at the value that leaves sampling as it is
NEUTRAL = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0, "penalize_newline": False,
           "mirostat_tau": None, "mirostat_eta": None}
OPTIONS = V.Object("options", doc="Ollama's model options.")


class Options:
    """The options as read: `values` the applied ones by name."""

    __slots__ = ("values",)

    def __init__(self, values: dict):
        self.values = values

    def get(self, name: str, default=None):
        value = self.values.get(name)
        return default if value is None else value


def read_options(body: dict, field: str = "options") -> Options:
    raw = body.get(field)
    if raw is None:
        return Options({})
    if not isinstance(raw, dict):
        raise invalid(f"'{field}' must be an object of model options", field)
    values = {}
    for name, value in raw.items():
        where = f"{field}.{name}"
        spec = APPLIED.get(name)
        if spec is not None:
            if value is not None:
                values[name] = spec.check(value, (field, name))
                if name == "num_predict" and value == 0:
                    raise invalid(f"'{where}' 0 would generate nothing: a positive count, or -1 for "
                                  "until the context ends", where)
        elif name in MACHINE:
            continue
        elif name in NEUTRAL:
            neutral = NEUTRAL[name]
            if value is not None and neutral is not None and value != neutral and not (
                    name == "mirostat" and value == 0):
                raise invalid(f"'{where}' is not supported: stackd's sampler has no {name} "
                              f"(leave it out or at {neutral!r})", where)
        else:
            raise invalid(f"'{where}' is not an option stackd knows (Ollama's options: "
                          f"{', '.join(sorted(APPLIED))}, ...)", where)
    return Options(values)


def grammar_of(body: dict) -> str:
    """`format`: "json" (any JSON value), a JSON Schema object (the grammar path, bounded as
    response_format's), or "" / absent (free text)."""
    value = body.get("format")
    if value is None or value == "":
        return ""
    if value == "json":
        return json_gbnf()
    if isinstance(value, dict):
        return json_schema_grammar(value, param="format")
    raise invalid("'format' must be \"json\" or a JSON Schema object", "format")


THINK_LEVELS = ("low", "medium", "high")


def effort_of(body: dict) -> str | None:
    """`think`: false switches a thinking template's thinking off, true (and absent) leaves it
    on with the default budget, a level bounds it as reasoning_effort's levels do."""
    think = body.get("think")
    if think is None or think is True:
        return None
    if think is False:
        return "none"
    if isinstance(think, str) and think in THINK_LEVELS:
        return think
    raise invalid("'think' must be true, false, \"low\", \"medium\" or \"high\"", "think")


def keep_alive_of(body: dict) -> float | None:
    """`keep_alive` in seconds (durations.NEVER for a negative one), None when absent."""
    value = body.get("keep_alive")
    if value is None:
        return None
    try:
        return durations.seconds(value)
    except durations.DurationError as exc:
        raise invalid(f"'keep_alive': {exc}", "keep_alive") from None


def stream_of(body: dict) -> bool:
    """Ollama streams unless told not to."""
    value = body.get("stream")
    if value is None:
        return True
    if not isinstance(value, bool):
        raise invalid("'stream' must be a boolean", "stream")
    return value


def generation(options: Options, grammar: str, stream: bool) -> GenerationParams:
    """One choice; Ollama's num_predict -1 (and -2, "fill the context") is until the context ends."""
    s = SamplingParams()
    s.temperature = options.get("temperature", params.DEFAULT_TEMPERATURE)
    s.top_p = options.get("top_p", params.DEFAULT_TOP_P)
    s.top_k = options.get("top_k", params.DEFAULT_TOP_K)
    s.min_p = options.get("min_p", params.DEFAULT_MIN_P)
    s.repeat_penalty = options.get("repeat_penalty", 1.0)
    s.presence_penalty = options.get("presence_penalty", 0.0)
    s.frequency_penalty = options.get("frequency_penalty", 0.0)
    seed = options.get("seed")
    if seed is not None and seed >= 0:       # Ollama's -1: random
        s.seed = seed32(seed)
    s.grammar = grammar
    stop = options.get("stop", [])
    predict = options.get("num_predict")
    return GenerationParams(max_tokens=predict if predict is not None and predict > 0 else None,
                            stop=[stop] if isinstance(stop, str) else list(stop), n=1, stream=stream,
                            include_usage=stream,
                            sampling=s, seed=seed if seed is not None and seed >= 0 else None,
                            top_logprobs=0, logprobs=False, grammar=grammar)


def apply_window(gen: GenerationParams, options: Options, context_length: int) -> None:
    """repeat_last_n once the context is known: -1 is the whole context, as Ollama reads it."""
    last_n = options.get("repeat_last_n")
    if last_n is not None:
        gen.sampling.penalty_last_n = context_length if last_n == -1 else last_n
