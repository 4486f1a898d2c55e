"""The one guard: credentials -> Principal (through an authenticator), permission, rate limit.

Node API keys and console access tokens both come through here. A keep-alive connection
remembers the last Authorization header it authenticated and the principal it resolved to
(the request's Session), so repeated requests skip the key hash or the signature check; the
memory is dropped when the authenticator's generation moves (a key revoked, a level changed)
or the credential's own expiry passes.
"""
from __future__ import annotations

from time import time

from ..http.errors import ApiError, ErrorKind
from .key_auth import KeyAuthenticator, unauthenticated
from .keys import KeyStore
from .permissions import PUBLIC
from .ratelimit import RateLimiter


class Guard:
    def __init__(self, authenticator, limiter: RateLimiter | None):
        self.authenticator = authenticator
        self.versioned = authenticator.versioned
        self.limiter = limiter

    def __call__(self, request, route) -> None:
        permission = route.permission
        if permission is PUBLIC:
            return
        header = request.headers.get(b"authorization")
        if header is None:
            header = self.credential_of(request.headers, route)
        session = request.session
        generation = self.versioned.generation
        if session.credential == header and session.generation == generation:
            principal = session.principal
            if principal.expires is not None and principal.expires <= time():
                principal = self.authenticate(header)      # raises: the credential expired
        else:
            principal = self.authenticate(header)
            session.credential, session.principal, session.generation = header, principal, generation
        request.key = principal
        if permission is not None and permission not in principal.allowed:
            raise ApiError(ErrorKind.PERMISSION, self.authenticator.refusal(principal, permission))
        if route.group is not None and self.limiter is not None:
            request.rate_headers = self.limiter.admit(principal.id, principal.name, route.group)

    def precheck(self, headers: dict, route, session) -> None:
        """At the end of a request's head, before its body is read: no credential, or one
        that authenticates no one, is refused now (permission and rate limit wait for the
        whole request). A client without a key cannot hold a connection by trickling a body.
        What it resolves to is remembered in the session, as __call__ would."""
        if route.permission is PUBLIC:
            return
        header = headers.get(b"authorization")
        if header is None:
            header = self.credential_of(headers, route)
        generation = self.versioned.generation
        if session.credential == header and session.generation == generation:
            return
        principal = self.authenticate(header)
        session.credential, session.principal, session.generation = header, principal, generation

    def credential_of(self, headers: dict, route) -> bytes:
        """The credential of a route that also takes it in its own header (Anthropic's
        x-api-key: the bare key), as the Authorization value it stands for."""
        name = getattr(route, "credential_header", None)
        token = headers.get(name) if name is not None else None
        if token is None:
            message = self.authenticator.missing_message
            if name is not None:
                message += f" or '{name.decode()}: <key>'"
            raise unauthenticated(message)
        token = token.strip()
        if not token or b" " in token:
            raise unauthenticated(f"malformed {name.decode()} header: expected the bare key")
        return b"Bearer " + token

    def authenticate(self, header: bytes):
        scheme, _, token = header.partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            raise unauthenticated(self.authenticator.malformed_message)
        return self.authenticator.authenticate(token)


class KeyGuard(Guard):
    """The node API's guard: API key, permission, rate limit, in that order."""

    def __init__(self, keys: KeyStore, limiter: RateLimiter):
        super().__init__(KeyAuthenticator(keys), limiter)
        self.keys = keys
