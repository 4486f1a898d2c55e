"""The one place where the engine's error codes become HTTP answers."""
from __future__ import annotations

import functools

from ..engine.errors import EngineError, ErrorCode
from ..http.errors import ApiError, ErrorKind

RETRY = ((b"retry-after", b"1"),)

HTTP_OF = {
    ErrorCode.UNLOADED: (ErrorKind.UNAVAILABLE, RETRY),
    ErrorCode.SHUTTING_DOWN: (ErrorKind.UNAVAILABLE, RETRY),
    ErrorCode.WORKER_LOST: (ErrorKind.UNAVAILABLE, RETRY),
    ErrorCode.RESTARTING: (ErrorKind.UNAVAILABLE, RETRY),
    ErrorCode.FAILED: (ErrorKind.UNAVAILABLE, ((b"retry-after", b"60"),)),
    ErrorCode.QUEUE_FULL: (ErrorKind.UNAVAILABLE, RETRY),
    ErrorCode.OVER_SHARE: (ErrorKind.RATE_LIMIT, RETRY),
    ErrorCode.INVALID_GRAMMAR: (ErrorKind.INVALID_REQUEST, ()),
    ErrorCode.DECODE_FAILED: (ErrorKind.INTERNAL, ()),
    ErrorCode.PEER_UNREACHABLE: (ErrorKind.UNAVAILABLE, RETRY),
}


def api_error(error: EngineError) -> ApiError:
    kind, headers = HTTP_OF[error.code]
    param = "response_format" if error.code is ErrorCode.INVALID_GRAMMAR else None
    return ApiError(kind, error.message, param=param, headers=headers)


def of_event(error) -> ApiError:
    """The error of a failed generation event: an EngineError, or the engine's own text."""
    if isinstance(error, EngineError):
        return api_error(error)
    return api_error(EngineError(ErrorCode.DECODE_FAILED, f"generation failed: {error or 'engine error'}"))


def answers_engine_errors(handler):
    """Route tables wrap inference handlers with this: an EngineError becomes its HTTP answer."""
    @functools.wraps(handler)
    async def wrapped(ctx, request):
        try:
            return await handler(ctx, request)
        except EngineError as exc:
            raise api_error(exc) from None
    return wrapped
