"""One error taxonomy: every failure the service reports is an ErrorKind.

Each kind maps to exactly one (HTTP status, OpenAI error `type`). Handlers raise
`ApiError(kind, message)`; the dispatch wrapper turns it into the spec's body
`{"error": {"code": <status>, "message": ..., "type": ...}}`.
"""
from __future__ import annotations

import enum


# kind                     status  OpenAI `type`
_KINDS = """
INVALID_REQUEST            400     invalid_request_error
CONTEXT_LENGTH_EXCEEDED    400     context_length_exceeded
AUTHENTICATION             401     authentication_error
PERMISSION                 403     permission_error
NOT_FOUND                  404     not_found_error
MODEL_NOT_FOUND            404     model_not_found
METHOD_NOT_ALLOWED         405     invalid_request_error
REQUEST_TIMEOUT            408     timeout_error
CONFLICT                   409     conflict_error
STATE_CONFLICT             409     invalid_request_error
PAYLOAD_TOO_LARGE          413     invalid_request_error
URI_TOO_LONG               414     invalid_request_error
UNSUPPORTED_MEDIA_TYPE     415     invalid_request_error
RATE_LIMIT                 429     rate_limit_error
HEADERS_TOO_LARGE          431     invalid_request_error
INTERNAL                   500     api_error
NOT_IMPLEMENTED            501     not_implemented_error
INSUFFICIENT_MEMORY        507     insufficient_memory_error
UNAVAILABLE                503     service_unavailable_error
"""


class _Kind(enum.Enum):
    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def type(self) -> str:
        return self.value[1]


# STATE_CONFLICT: a transition the state forbids (CONFLICT: a name or a resource already taken)
ErrorKind = _Kind("ErrorKind", [(name, (int(status), kind)) for name, status, kind in
                                (line.split() for line in _KINDS.strip().splitlines())],
                  module=__name__)


class ApiError(Exception):
    """An error meant for the client. `headers` are extra response headers."""

    __slots__ = ("kind", "message", "param", "headers", "delay")

    def __init__(self, kind: ErrorKind, message: str, *, param: str | None = None,
                 headers: tuple[tuple[bytes, bytes], ...] = (), delay: float = 0.0):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.headers = headers
        self.delay = delay      # seconds to hold the answer back (a refusal by rate limit)

    def body(self) -> dict:
        error = {"code": self.kind.status, "message": self.message, "type": self.kind.type}
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}


class ErrorShape:
    """How a route words its errors when it speaks another API's dialect (Anthropic's
    /v1/messages): `body(err)` is the JSON it answers for an ApiError, `schema` its JSON Schema
    in the OpenAPI document under `name`. Routes without one answer in the spec's shape
    (ApiError.body). The HTTP layer's own refusals (408, 413, 414, 431: before a route is
    known) keep the spec's shape on every route."""

    __slots__ = ("name", "body", "schema")

    def __init__(self, name: str, body, schema: dict):
        self.name = name
        self.body = body                # body(ApiError) -> dict
        self.schema = schema


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(ErrorKind.INVALID_REQUEST, message, param=param)
