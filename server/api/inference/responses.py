"""Response bodies and stream chunks in OpenAI's exact shapes, and what they are built from."""
from __future__ import annotations

import codecs
import os
import time

import orjson

from ... import __version__
from ...runtime.runner import finish_reason

SYSTEM_FINGERPRINT = f"stackd-{__version__}"
SSE_DONE = b"data: [DONE]\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{os.urandom(12).hex()}"


def sse(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class Choice:
    """What one choice has produced so far."""

    __slots__ = ("text", "finish_reason", "logprobs", "n_prompt", "n_cached", "n_generated", "error",
                 "timings", "stop", "prompt_logprobs")

    def __init__(self):
        self.text: list[bytes] = []
        self.finish_reason: str | None = None
        self.logprobs: list = []
        self.n_prompt = self.n_cached = self.n_generated = 0
        self.error: str | None = None
        self.timings = None               # server._engine.Timings, from the finishing event
        self.stop: str | None = None      # the stop string that ended the text, if one did
        self.prompt_logprobs: list | None = None   # asked for (echo): prompt tokens 2.., from the engine

    def add(self, event) -> None:
        self.text.append(event.text)
        entries = event.logprobs
        if entries:
            self.logprobs.extend(entries)
        prompt = getattr(event, "prompt_logprobs", None)     # an ended-by-the-runner event has none
        if prompt:
            self.prompt_logprobs = prompt
        self.n_prompt, self.n_cached, self.n_generated = event.n_prompt, event.n_cached, event.n_generated
        reason = finish_reason(event.status)
        if reason is not None:
            self.finish_reason = reason
            self.error = event.error
            self.timings = event.timings
            self.stop = event.stop

    def joined(self) -> str:
        return b"".join(self.text).decode("utf-8", "replace")


def stop_field(choice: Choice, requested: list[str]) -> dict:
    """{"stop_reason": the stop string} when one the client asked for ended the choice, as
    vLLM reports it (a dialect's stop sequence comes from it); {} otherwise, also when a stop
    the chat format added (a tool call's end) ended it."""
    return {"stop_reason": choice.stop} if choice.stop is not None and choice.stop in requested else {}


def usage(choices: list[Choice], prompts_counted: list[int]) -> dict:
    """Prompt tokens count once per distinct prompt (choices of one prompt share it)."""
    prompt = sum(choices[i].n_prompt for i in prompts_counted)
    cached = sum(choices[i].n_cached for i in prompts_counted)
    completion = sum(c.n_generated for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _piece(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def chat_logprobs(entries: list) -> dict:
    return {"content": [{
        "token": _piece(piece), "logprob": logprob, "bytes": list(piece),
        "top_logprobs": [{"token": _piece(p), "logprob": lp, "bytes": list(p)} for _, lp, p in top],
    } for _, logprob, piece, top in entries], "refusal": None}


def completion_logprobs(entries: list, offset: int = 0, prompt: tuple | None = None) -> dict:
    """OpenAI's legacy `logprobs` of a choice: its tokens, their log probabilities, the top
    alternatives and where each token starts in the choice's text (`offset`: the characters
    before the first). `prompt` (echo with logprobs): (the first prompt token's piece, the
    engine's entries of the others), listed first; the first token has no log probability
    (null), as OpenAI answered it. Offsets count the characters of the text as decoded, a
    character split over tokens at the token that completes it."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(piece: bytes, logprob, top) -> None:
        nonlocal offset
        tokens.append(_piece(piece))
        token_logprobs.append(logprob)
        top_logprobs.append(top)
        offsets.append(offset)
        offset += len(decoder.decode(piece))

    if prompt is not None:
        first, rows = prompt
        add(first, None, None)
        for _, logprob, piece, top in rows or ():
            add(piece, logprob, {_piece(p): lp for _, lp, p in top})
    for _, logprob, piece, top in entries:
        add(piece, logprob, {_piece(p): lp for _, lp, p in top})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}


def envelope(kind: str, response_id: str, model: str, created: int | None = None) -> dict:
    return {"id": response_id, "object": kind, "created": created or int(time.time()),
            "model": model, "system_fingerprint": SYSTEM_FINGERPRINT}
