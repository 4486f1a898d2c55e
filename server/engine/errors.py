"""Why the engine could not do what was asked: one code per cause, from where it happens to the
one place that maps codes to HTTP (server/api/errors.py). Nobody matches messages."""
from __future__ import annotations

import enum

from ..errors import DomainError


class ErrorCode(enum.Enum):
    UNLOADED = "unloaded"                  # the model was unloaded under the request
    SHUTTING_DOWN = "shutting_down"        # the daemon is stopping
    WORKER_LOST = "worker_lost"            # the model's worker process died
    RESTARTING = "restarting"              # the worker is being restarted
    FAILED = "failed"                      # the worker gave up after repeated crashes
    QUEUE_FULL = "queue_full"              # the model's queue is full
    OVER_SHARE = "over_share"              # this key holds its share of the queue
    INVALID_GRAMMAR = "invalid_grammar"    # llama.cpp could not parse the grammar
    DECODE_FAILED = "decode_failed"        # llama.cpp failed the step (the engine's own errors)
    PEER_UNREACHABLE = "peer_unreachable"  # a node holding part of the model cannot be reached
    # a text prompt, tokenized where the vocabulary is (submission.Unfit: the same values)
    PROMPT_EMPTY = "prompt_empty"          # nothing left of it after tokenization
    CONTEXT_LENGTH = "context_length_exceeded"   # no room left in the context to generate


class EngineError(DomainError):
    """A DomainError whose code is an ErrorCode; a refused grammar names response_format, a
    prompt that does not fit the field it came from (`param`)."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None):
        super().__init__(code, message,
                         param="response_format" if code is ErrorCode.INVALID_GRAMMAR else param)


class EndedEvent:
    """The last event of a request the daemon side ends itself (its model unloaded, its worker
    lost): the native Event's field names, with the typed EngineError as `error`."""

    __slots__ = ("id_request", "status", "error")
    text = b""
    n_tokens = n_prompt = n_cached = n_generated = 0
    logprobs = embedding = timings = stop = None

    def __init__(self, id_request: int, status: int, error: EngineError):
        self.id_request, self.status, self.error = id_request, status, error
