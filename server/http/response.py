"""What a handler returns: a whole response, or a stream of chunks."""
from __future__ import annotations

from typing import AsyncIterator

import cython
import orjson

from .errors import ApiError
from .wire import JSON


@cython.cclass
class Response:
    status = cython.declare(cython.int, visibility="public")
    body = cython.declare(bytes, visibility="public")
    content_type = cython.declare(bytes, visibility="public")
    headers = cython.declare(tuple, visibility="public")

    def __init__(self, status: int = 200, body: bytes = b"", content_type: bytes = JSON,
                 headers: tuple[tuple[bytes, bytes], ...] = ()):
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class StreamingResponse:
    """A response sent as it is produced (chunked on HTTP/1.1).

    The protocol pulls `chunks` one at a time and waits while the client's
    socket buffer is above its high-water mark, so a slow reader slows the
    producer instead of growing memory. `chunks` is closed when the client goes.
    """

    __slots__ = ("status", "chunks", "content_type", "headers")

    def __init__(self, chunks: AsyncIterator[bytes], content_type: bytes,
                 status: int = 200, headers: tuple[tuple[bytes, bytes], ...] = ()):
        self.status = status
        self.chunks = chunks
        self.content_type = content_type
        self.headers = headers


def json_response(obj, status: int = 200, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    return Response(status, orjson.dumps(obj), JSON, headers)


def error_response(err: ApiError, shape=None) -> Response:
    """`shape`: the route's errors.ErrorShape, None for the spec's shape."""
    body = err.body() if shape is None else shape.body(err)
    return Response(err.kind.status, orjson.dumps(body), JSON, err.headers)
