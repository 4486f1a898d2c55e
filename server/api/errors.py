"""The one place where domain errors become HTTP answers.

Domain code raises DomainError (server/errors.py; the engine's EngineError is one) with a code;
this table gives each code its HTTP error kind and, for the ones worth retrying, the default
Retry-After. The apps apply it to whatever a handler raises (`to_api_error`, handed to
http.routing.App); streams that already sent their head use it to word their last event.
"""
from __future__ import annotations

from ..auth.key_auth import CHALLENGE
from ..engine.errors import EngineError, ErrorCode
from ..errors import Code, DomainError
from ..http.errors import ApiError, ErrorKind

# code -> (kind, Retry-After seconds or None)
HTTP_OF = {
    Code.INVALID: (ErrorKind.INVALID_REQUEST, None),
    Code.NOT_FOUND: (ErrorKind.NOT_FOUND, None),
    Code.MODEL_NOT_FOUND: (ErrorKind.MODEL_NOT_FOUND, None),
    Code.TAKEN: (ErrorKind.CONFLICT, None),
    Code.STATE: (ErrorKind.STATE_CONFLICT, None),
    Code.UNAUTHENTICATED: (ErrorKind.AUTHENTICATION, None),
    Code.FORBIDDEN: (ErrorKind.PERMISSION, None),
    Code.UNAVAILABLE: (ErrorKind.UNAVAILABLE, 1),
    Code.TOO_LARGE: (ErrorKind.PAYLOAD_TOO_LARGE, None),
    Code.INSUFFICIENT_MEMORY: (ErrorKind.INSUFFICIENT_MEMORY, None),
    Code.INTERNAL: (ErrorKind.INTERNAL, None),
    ErrorCode.UNLOADED: (ErrorKind.UNAVAILABLE, 1),
    ErrorCode.SHUTTING_DOWN: (ErrorKind.UNAVAILABLE, 1),
    ErrorCode.WORKER_LOST: (ErrorKind.UNAVAILABLE, 1),
    ErrorCode.RESTARTING: (ErrorKind.UNAVAILABLE, 1),
    ErrorCode.FAILED: (ErrorKind.UNAVAILABLE, 60),
    ErrorCode.QUEUE_FULL: (ErrorKind.UNAVAILABLE, 1),
    ErrorCode.OVER_SHARE: (ErrorKind.RATE_LIMIT, 1),
    ErrorCode.INVALID_GRAMMAR: (ErrorKind.INVALID_REQUEST, None),
    ErrorCode.DECODE_FAILED: (ErrorKind.INTERNAL, None),
    ErrorCode.PEER_UNREACHABLE: (ErrorKind.UNAVAILABLE, 1),
    ErrorCode.PROMPT_EMPTY: (ErrorKind.INVALID_REQUEST, None),
    ErrorCode.CONTEXT_LENGTH: (ErrorKind.CONTEXT_LENGTH_EXCEEDED, None),
}


def api_error(error: DomainError) -> ApiError:
    kind, retry = HTTP_OF[error.code]
    if error.retry_after is not None:
        retry = error.retry_after
    headers = ((b"retry-after", str(retry).encode()),) if retry is not None else ()
    if error.code is Code.UNAUTHENTICATED:
        headers += CHALLENGE
    return ApiError(kind, error.message, param=error.param, headers=headers)


def to_api_error(exc: Exception) -> ApiError | None:
    """What the apps answer for an exception a handler raised: None for one that is not the
    domain's (a bug: the app logs it and answers 500)."""
    return api_error(exc) if isinstance(exc, DomainError) else None


def answer_of(exc: ApiError | DomainError) -> ApiError:
    """For a stream whose head is sent: the error its last event reports."""
    return exc if isinstance(exc, ApiError) else api_error(exc)


def of_event(error) -> ApiError:
    """The error of a failed generation event: an EngineError, or the engine's own text."""
    if isinstance(error, DomainError):
        return api_error(error)
    return api_error(EngineError(ErrorCode.DECODE_FAILED, f"generation failed: {error or 'engine error'}"))
