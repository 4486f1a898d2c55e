"""The typed request every generation dialect parses into, before anything is rendered.

`GenerationParams`: the sampling and the answer's shape (max_tokens, stops, n, logprobs,
streaming) of one request, whatever dialect wrote it. `ChatRequest`: a conversation to answer,
read once from its body (api/inference/chat.py `parse`), then prepared (rendered, its grammar
and token texts) and submitted in one hop (api/inference/chat.py `prepare`, `start`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.core import SAMPLING_FIELDS, SamplingParams


@dataclass
class GenerationParams:
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
    best_of: int = 0                # candidates generated per prompt (completions); 0: n
    extra: dict = field(default_factory=dict)
    format_stops: list[str] = field(default_factory=list)   # the chat format's, beside the client's

    @property
    def candidates(self) -> int:
        """Choices generated per prompt: best_of, or n."""
        return max(self.best_of, self.n)

    @property
    def engine_stops(self) -> list[str]:
        """Every string that ends the text: the client's `stop`, then the format's."""
        return self.stop + self.format_stops

    def sampling_for_choice(self, index: int) -> SamplingParams:
        """Choice i of a seeded request uses seed + i: distinct, and reproducible."""
        if index == 0 or self.seed is None:
            return self.sampling
        params = copy_sampling(self.sampling)
        params.seed = seed32(self.seed + index)
        return params


def copy_sampling(p: SamplingParams) -> SamplingParams:
    q = SamplingParams()
    for name in SAMPLING_FIELDS:
        setattr(q, name, getattr(p, name))
    return q


def seed32(seed: int) -> int:
    value = seed & 0xFFFFFFFF
    return value if value != 0xFFFFFFFF else 0xFFFFFFFE   # 0xFFFFFFFF means "random" to llama.cpp




def plain_sampling(*, temperature: float, top_p: float, top_k: int, min_p: float,
                   grammar: str = "", seed: int | None = None) -> SamplingParams:
    """The sampling of a dialect that has only the common knobs (Responses, Anthropic
    messages): no penalties, biases or logprobs."""
    s = SamplingParams()
    s.temperature, s.top_p, s.top_k, s.min_p = temperature, top_p, top_k, min_p
    s.grammar = grammar
    if seed is not None:
        s.seed = seed32(seed)
    return s


def plain_generation(sampling: SamplingParams, *, max_tokens: int | None, stop: list[str],
                     stream: bool) -> GenerationParams:
    """One choice, no logprobs; a stream reports usage (both dialects end theirs with it)."""
    return GenerationParams(max_tokens=max_tokens, stop=list(stop), n=1, stream=stream,
                            include_usage=stream, sampling=sampling, seed=None, top_logprobs=0,
                            logprobs=False, grammar=sampling.grammar)


@dataclass
class ChatRequest:
    """A conversation to answer. `messages`: as the template takes them (role, content, and a
    turn's name, tool_call_id, tool_calls, reasoning_content); `tools`: chat.tools.ToolRequest
    or None; `reasoning_effort`: None (the default budget), "none" (thinking off) or a budget's
    name (chat/limits.py).

    `names`: where the fields that are checked only once the model is known came from in the
    dialect's body, so that their 400s name the field the client sent ("messages" is
    Responses' "input", "response_format" its "text.format"); absent names are chat's own."""
    model: str
    messages: list[dict]
    gen: GenerationParams
    tools: object = None
    reasoning_effort: str | None = None
    names: dict[str, str] = field(default_factory=dict)

    def name_of(self, name: str) -> str:
        return self.names.get(name, name)
