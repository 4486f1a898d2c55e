"""The node API's guard: API key, permission, rate limit, in that order."""
from __future__ import annotations

from ..http.errors import ApiError, ErrorKind
from .keys import KeyStore
from .ratelimit import RateLimiter

_CHALLENGE = ((b"www-authenticate", b'Bearer realm="stackd"'),)


def _unauthenticated(message: str) -> ApiError:
    return ApiError(ErrorKind.AUTHENTICATION, message, headers=_CHALLENGE)


class KeyGuard:
    def __init__(self, keys: KeyStore, limiter: RateLimiter):
        self.keys = keys
        self.limiter = limiter

    def __call__(self, request, route) -> None:
        header = request.headers.get(b"authorization")
        if header is None:
            raise _unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
        session = request.session
        keys = self.keys
        if session.credential == header and session.generation == keys.generation:
            key = session.principal
        else:
            key = self.authenticate(header)
            session.credential, session.principal, session.generation = header, key, keys.generation
        request.key = key
        if route.permission is not None and route.permission not in key.allowed:
            raise ApiError(ErrorKind.PERMISSION,
                           f"this API key lacks the '{route.permission}' permission")
        if route.group is not None:
            request.rate_headers = self.limiter.admit(key.id, key.name, route.group)

    def authenticate(self, header: bytes):
        scheme, _, token = header.partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            raise _unauthenticated("malformed Authorization header: expected 'Bearer <key>'")
        key = self.keys.lookup(token)
        if key is None:
            raise _unauthenticated("invalid API key")
        return key
