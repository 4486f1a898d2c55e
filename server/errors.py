"""What the domain refuses or fails at: one code per cause, carried from where it happens to
the one place that maps codes to HTTP answers (api/errors.py). Domain code (runtime, store,
cluster, chat, console) raises DomainError; it never builds an HTTP error, and nobody matches
messages to choose a status.

This module imports nothing of the package: every layer may raise these.
"""
from __future__ import annotations

import enum


class Code(enum.Enum):
    INVALID = "invalid"                          # a value the operation cannot take
    NOT_FOUND = "not_found"
    MODEL_NOT_FOUND = "model_not_found"          # not in the store
    TAKEN = "taken"                              # a name already in use
    STATE = "state"                              # a transition the current state forbids
    UNAUTHENTICATED = "unauthenticated"          # bad credentials or token
    FORBIDDEN = "forbidden"                      # known, but not allowed
    UNAVAILABLE = "unavailable"                  # not now (a model not loaded, a peer away): retry
    TOO_LARGE = "too_large"                      # more bytes than a limit allows
    INSUFFICIENT_MEMORY = "insufficient_memory"  # the model does not fit; nothing was changed
    INTERNAL = "internal"                        # a failure that is ours, not the caller's


class DomainError(Exception):
    """`code` is a Code (or the engine's ErrorCode); `param` names the request field at fault;
    `retry_after` (seconds) overrides the code's default hint, where it has one."""

    __slots__ = ("code", "message", "param", "retry_after")

    def __init__(self, code: enum.Enum, message: str, *, param: str | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after


def invalid(message: str, param: str | None = None) -> DomainError:
    return DomainError(Code.INVALID, message, param=param)
