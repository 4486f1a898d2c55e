"""Node-to-node routes: /internal/v1/... on the cluster port, only for requests signed with the
cluster secret (server/cluster/signing.py).

They exist only when the node has a cluster secret. The cluster port's guard hands these paths
to `SignatureGuard` and every other path to the API-key guard: a user API key is refused here
(401 `authentication_error`; keys are per node and never travel between nodes), and so is a
missing, bad, stale or replayed signature. Successful answers are signed over the request's
nonce, so the caller knows they came from a node of the cluster.

Other modules add their routes with `register(table)` before the apps are built (at import).
"""
from __future__ import annotations

import inspect
from dataclasses import replace

from ...auth.principal import Principal
from ...http.errors import ApiError, ErrorKind
from ...http.response import Response, StreamingResponse, json_response
from ...http.routing import Endpoint
from ...cluster import signing

PREFIX = "/internal/v1/"
NODE_PRINCIPAL = frozenset({"cluster:node"})


class SignatureGuard:
    """Authenticates a request by its cluster signature; refuses everything else with 401."""

    def __init__(self, secret: bytes):
        self.secret = secret
        self.replays = signing.ReplayCache()

    def __call__(self, request, route) -> None:
        if request.headers.get(b"authorization") is not None:
            raise ApiError(ErrorKind.AUTHENTICATION, "API keys are not accepted on internal routes: "
                           "they take only requests signed with the cluster secret")
        target = request.path + ("?" + request.query if request.query else "")
        try:
            signed = signing.verify(self.secret, request.method, target, request.body, request.headers)
            self.replays.admit(signed["nonce"], signed["timestamp"])
        except signing.SignatureError as exc:
            raise ApiError(ErrorKind.AUTHENTICATION, str(exc)) from None
        request.key = Principal("node", signed["node"], signed["node"] or "node", NODE_PRINCIPAL)


class ClusterPortGuard:
    """The cluster port's guard: internal paths by signature, the rest by API key."""

    def __init__(self, key_guard, signature_guard: SignatureGuard):
        self.key_guard = key_guard
        self.signature_guard = signature_guard

    def __call__(self, request, route) -> None:
        if route.path.startswith(PREFIX):
            self.signature_guard(request, route)
        else:
            self.key_guard(request, route)

    def precheck(self, headers: dict, route, session) -> None:
        """Keys at the end of the head (Guard.precheck); a signature covers the body: later."""
        if not route.path.startswith(PREFIX):
            self.key_guard.precheck(headers, route, session)


# ---- the routes ----------------------------------------------------------------------------------

def _sender(request) -> str:
    return request.key.id


def heartbeat(ctx, request) -> Response:
    """A follower's heartbeat (its first one registers it): the leader's answer carries its
    view of the cluster and the follower's compute scale."""
    return json_response(ctx.membership.receive_heartbeat(_sender(request), request.json()))


def leave(ctx, request) -> Response:
    """A follower that shuts down says so: it is forgotten rather than reported down."""
    return json_response(ctx.membership.receive_leave(_sender(request)))


def describe(ctx, request) -> Response:
    """This node's own /v1/nodes entry."""
    return json_response(ctx.membership.own_entry())


ROUTES: dict = {
    ("POST", PREFIX + "heartbeat"): Endpoint(heartbeat, None, summary="A follower's heartbeat"),
    ("POST", PREFIX + "leave"): Endpoint(leave, None, summary="A follower leaves the cluster"),
    ("GET", PREFIX + "node"): Endpoint(describe, None, summary="This node's entry"),
}


def register(table: dict) -> None:
    """Adds another module's internal routes: keys (method, "/internal/v1/..."), values Endpoints
    whose handlers take (ctx, request). Call it before the apps are built."""
    for (method, path), endpoint in table.items():
        if not path.startswith(PREFIX):
            raise ValueError(f"internal routes live under {PREFIX}: {path}")
        if (method, path) in ROUTES and ROUTES[(method, path)] is not endpoint:
            raise ValueError(f"internal route registered twice: {method} {path}")
        ROUTES[(method, path)] = endpoint


def signed_routes(secret: bytes) -> dict:
    """ROUTES with every answer signed; no rate-limit group (the secret is the limit)."""
    return {key: replace(endpoint, handler=_signing(endpoint.handler, secret), group=None)
            for key, endpoint in ROUTES.items()}


def _signing(handler, secret: bytes):
    def signed(ctx, request):
        result = handler(ctx, request)
        if inspect.isawaitable(result):
            return _sign_later(result, request, secret)
        return _sign(result, request, secret)
    return signed


async def _sign_later(awaitable, request, secret: bytes):
    return _sign(await awaitable, request, secret)


def _sign(response, request, secret: bytes):
    """A whole answer is signed over its status and body; a stream (the replica stream) over
    its status and an empty body, before its first frame: its frames follow on the connection
    that the signed request opened."""
    if not isinstance(response, (Response, StreamingResponse)):
        raise TypeError("internal routes answer with a Response or a StreamingResponse")
    nonce = request.headers[signing.NONCE.encode()].decode()
    body = response.body if isinstance(response, Response) else b""
    mac = signing.sign_answer(secret, nonce, response.status, body)
    response.headers = tuple(response.headers) + ((signing.SIGNATURE.encode(), mac.encode()),)
    return response
