"""Internal routes a leader calls on a follower for ggml RPC servers (cluster port, signed
with the cluster secret by the internal route group):

    POST /internal/v1/rpc/start {"placement_id", "threads", "leader_id"} -> {"port"}   the relay to dial
    POST /internal/v1/rpc/stop  {"placement_id"}                         -> {"stopped"}
    GET  /internal/v1/rpc                                                -> {"servers": [...]}

The children are this node's `RpcServers` (ClusterContext.rpc). A follower restarts none on its
own; it stops them all when it is fenced (it lost its leader).
"""
from __future__ import annotations

from ...http import validate
from ...http.errors import ApiError, ErrorKind
from ...http.openapi import json_answer
from ...http.response import Response, json_response
from ...http.routing import Endpoint
from ...cluster.rpc_server import RpcServerError, RpcServers

PLACEMENT_ID = validate.String("placement_id", required=True, max_len=128,
                               doc="The leader's id for this placement of a model.")
LEADER_ID = validate.String("leader_id", required=True, max_len=128, doc="The leader asking.")
THREADS = validate.Integer("threads", required=True, lo=1, hi=1024, doc="The RPC server's compute threads.")
START_BODY = validate.Body(PLACEMENT_ID, THREADS, LEADER_ID)
STOP_BODY = validate.Body(PLACEMENT_ID)


async def handle(servers: RpcServers, method: str, path: str, body: dict) -> dict:
    """The routes' work, apart from HTTP (a simulated follower calls it directly)."""
    if (method, path) == ("POST", "/internal/v1/rpc/start"):
        placement_id, threads, leader_id = PLACEMENT_ID.read(body), THREADS.read(body), LEADER_ID.read(body)
        try:
            child = await servers.start(placement_id, threads, leader_id)
        except RpcServerError as exc:
            raise ApiError(ErrorKind.UNAVAILABLE, f"cannot start an RPC server: {exc}") from None
        return {"port": child.port}
    if (method, path) == ("POST", "/internal/v1/rpc/stop"):
        return {"stopped": await servers.stop(PLACEMENT_ID.read(body))}
    if (method, path) == ("GET", "/internal/v1/rpc"):
        return {"servers": servers.listing()}
    raise ApiError(ErrorKind.NOT_FOUND, f"no internal route {method} {path}")


async def start(ctx, request) -> Response:
    """Start an RPC server child for a placement; answers the port of its relay."""
    return json_response(await handle(ctx.rpc, "POST", "/internal/v1/rpc/start", request.json()))


async def stop(ctx, request) -> Response:
    """Stop a placement's RPC server child (unload, re-placement)."""
    return json_response(await handle(ctx.rpc, "POST", "/internal/v1/rpc/stop", request.json()))


async def listing(ctx, request) -> Response:
    """This node's RPC server children and their state (the heartbeat's RPC state)."""
    return json_response(await handle(ctx.rpc, "GET", "/internal/v1/rpc", {}))


_PORT = {"type": "object", "required": ["port"], "properties": {"port": {"type": "integer"}}}
_STOPPED = {"type": "object", "required": ["stopped"], "properties": {"stopped": {"type": "boolean"}}}
_SERVERS = {"type": "object", "required": ["servers"], "properties": {"servers": {"type": "array"}}}

# Authenticated by the internal group's signature check, never by a user key.
ROUTES = {
    ("POST", "/internal/v1/rpc/start"): Endpoint(start, None, body=START_BODY, responses={
        200: json_answer(_PORT, "The relay's port."), 503: "No port or the server failed to start."}),
    ("POST", "/internal/v1/rpc/stop"): Endpoint(stop, None, body=STOP_BODY, responses={
        200: json_answer(_STOPPED, "Whether a child was stopped.")}),
    ("GET", "/internal/v1/rpc"): Endpoint(listing, None, responses={
        200: json_answer(_SERVERS, "The children.")}),
}


def register() -> bool:
    """Add these routes to the internal group (api/cluster/internal.py, the membership
    side's). Without that module there is no internal group to join: False."""
    try:
        from . import internal
    except ImportError:
        return False
    internal.register(ROUTES)
    return True
