"""The request as handlers see it: a slot class filled by the protocol."""
from __future__ import annotations

import cython
import orjson

from .errors import ApiError, ErrorKind, invalid


@cython.cclass
class Session:
    """Per-connection memory of the guard: the last credential that authenticated on this
    connection and what it resolved to, so a keep-alive client is not re-hashed on every
    request. Holds only what this same client sent; invalidated by a key-store generation."""

    credential = cython.declare(object, visibility="public")
    principal = cython.declare(object, visibility="public")
    generation = cython.declare(object, visibility="public")

    def __init__(self):
        self.credential = None
        self.principal = None
        self.generation = -1


@cython.cclass
class Request:
    method = cython.declare(str, visibility="public")
    path = cython.declare(str, visibility="public")
    query = cython.declare(str, visibility="public")
    headers = cython.declare(dict, visibility="public")
    body = cython.declare(bytes, visibility="public")
    request_id = cython.declare(bytes, visibility="public")
    keep_alive = cython.declare(cython.bint, visibility="public")
    route = cython.declare(object, visibility="public")
    params = cython.declare(dict, visibility="public")
    key = cython.declare(object, visibility="public")
    rate_headers = cython.declare(bytes, visibility="public")
    t_start = cython.declare(cython.double, visibility="public")
    peer = cython.declare(str, visibility="public")
    session = cython.declare(object, visibility="public")

    def __init__(self, method: str, path: str, query: str, headers: dict[bytes, bytes],
                 body: bytes, request_id: bytes, keep_alive: bool, route, params: dict,
                 t_start: float, peer: str, session):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers          # lower-cased names; repeated fields joined by ", "
        self.body = body
        self.request_id = request_id
        self.keep_alive = keep_alive
        self.route = route              # server.http.routing.Route, or None when unmatched
        self.params = params            # path parameters, percent-decoded
        self.key = None                 # the caller's auth.principal.Principal once authenticated
        self.rate_headers = b""         # x-ratelimit-* lines for this response
        self.t_start = t_start
        self.peer = peer
        self.session = session          # per-connection state a guard may use (Session)

    def json(self) -> dict:
        """The body as a JSON object, or a 400 that says what is wrong."""
        content_type = self.headers.get(b"content-type")
        if content_type is not None:
            media = content_type.split(b";", 1)[0].strip().lower()
            if media != b"application/json" and not media.endswith(b"+json"):
                raise ApiError(ErrorKind.UNSUPPORTED_MEDIA_TYPE,
                               "Content-Type must be application/json", param="Content-Type")
        if not self.body:
            raise invalid("request body is empty: a JSON object is required")
        try:
            obj = orjson.loads(self.body)
        except orjson.JSONDecodeError as exc:
            raise invalid(f"request body is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise invalid("request body must be a JSON object")
        return obj
