"""The /api group (spec 4.4): one route table, each endpoint at its access level.

Levels are permissions (`auth.levels`): the guard refuses what a principal's level does not
include, so a handler only parses, calls the domain and answers. Domain refusals (Refused)
become the taxonomy's errors where every app maps them: api/errors.py.
"""
from __future__ import annotations

import time
from urllib.parse import parse_qs

import orjson

from ...auth import levels
from ...auth.permissions import PUBLIC
from ...http import validate as v
from ...http.errors import ApiError, ErrorKind, invalid
from ...http.openapi import json_answer
from ...http.response import Response, json_response
from ...http.routing import Endpoint
from . import dashboard, static
from ...console.accounts import MAX_REASON, profile
from ...console.devices import PAIRING_TTL, PAIRING_TTL_RANGE
from ...console.directory import APPROVED, PENDING, REJECTED
from ...console.passwords import MAX_LENGTH
from ...console.signing import ISSUER

NONE = levels.permission(levels.NONE)
USER = levels.permission(levels.USER)
VIEWER = levels.permission(levels.VIEWER)
OPERATOR = levels.permission(levels.OPERATOR)
ADMIN = levels.permission(levels.ADMIN)

TERMINAL_AUDIENCE = "terminal"
TERMINAL_TTL = 5 * 60
MAX_SECRET = 4096


def _body_or_empty(request) -> dict:
    return request.json() if request.body else {}


def _client_address(request) -> str:
    return request.peer.rpartition(":")[0] or request.peer


def _listing(items: list) -> Response:
    return json_response({"object": "list", "data": items})


# ---- open: liveness, keys, accounts -----------------------------------------------------------

def health(console, request) -> Response:
    return json_response({"status": "ok", "uptime_seconds": int(time.monotonic() - console.started)})


def jwks(console, request) -> Response:
    return json_response(console.keys.jwks(), headers=((b"cache-control", b"max-age=300"),))


async def signup(console, request) -> Response:
    body = request.json()
    username = v.string(body, "username", max_len=64)
    password = v.string(body, "password", max_len=MAX_LENGTH)
    return json_response(await console.accounts.signup(username, password), 201)


async def login(console, request) -> Response:
    body = request.json()
    username = v.string(body, "username", max_len=64)
    password = v.string(body, "password", max_len=MAX_LENGTH)
    console.throttle.admit(username, _client_address(request))
    return json_response(await console.accounts.login(username, password))


async def refresh(console, request) -> Response:
    token = v.string(request.json(), "refresh_token", max_len=256)
    return json_response(await console.accounts.refresh(token))


async def logout(console, request) -> Response:
    await console.accounts.logout(v.string(request.json(), "refresh_token", max_len=256))
    return json_response({"revoked": True})


async def me(console, request) -> Response:
    return json_response(profile(await console.accounts.row(request.key.id)))


# ---- approved users and up ----------------------------------------------------------------------

async def topology(console, request) -> Response:
    url, key = console.settings.coordinator, console.coordinator_key()
    if not url or key is None:
        raise ApiError(ErrorKind.UNAVAILABLE, "no coordinator is configured: set "
                       "console.coordinator and console.coordinator_key_file")
    return await console.upstream.get(url + "/v1/topology", key, "the coordinator")


async def list_devices(console, request) -> Response:
    scope = request.key.devices
    return _listing([d for d in await console.devices.listing() if scope is None or d["id"] in scope])


async def _visible_device(console, request, device_id: str):
    scope = request.key.devices
    if scope is not None and device_id not in scope:
        raise ApiError(ErrorKind.PERMISSION, f"device {device_id!r} is outside your scope")
    return await console.devices.get(device_id)


async def device_models(console, request) -> Response:
    device = await _visible_device(console, request, request.params["id"])
    return await console.upstream.get(device.inference_url + "/v1/models",
                                      console.devices.api_key(device), f"device {device.name}")


async def device_metrics(console, request) -> Response:
    return await dashboard.device_metrics(console, request,
                                          await _visible_device(console, request, request.params["id"]))


async def device_requests(console, request) -> Response:
    return await dashboard.device_requests(console, request,
                                           await _visible_device(console, request, request.params["id"]))


async def exec_token(console, request) -> Response:
    device = await _visible_device(console, request, request.params["id"])
    token, expires_at = console.keys.sign(request.key.id, TERMINAL_AUDIENCE, TERMINAL_TTL,
                                          device=device.id, name=request.key.name)
    return json_response({"token": token, "expires_at": expires_at}, 201)


async def inference(console, request) -> Response:
    body = request.json()
    device_id = v.string(body, "device_id", max_len=64)
    v.string(body, "model", max_len=256)
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise invalid("'messages' must be a non-empty array", "messages")
    device = await _visible_device(console, request, device_id)
    del body["device_id"]
    return await console.upstream.chat(device.inference_url, console.devices.api_key(device),
                                       orjson.dumps(body), f"device {device.name}")


# ---- admins -------------------------------------------------------------------------------------

async def create_device(console, request) -> Response:
    body = request.json()
    device = await console.devices.create(
        v.string(body, "name", max_len=64), v.string(body, "inference_url", max_len=512),
        v.string(body, "cluster_url", max_len=512), v.string(body, "api_key", max_len=MAX_SECRET),
        request.key.name)
    console.spawn(console.check_device(device["id"]))
    return json_response(device, 201)


async def list_users(console, request) -> Response:
    states = parse_qs(request.query).get("state")
    state = states[-1] if states else None
    if state is not None and state not in (PENDING, APPROVED, REJECTED):
        raise invalid("'state' must be pending, approved or rejected", "state")
    return _listing(await console.accounts.listing(state))


async def approve(console, request) -> Response:
    level = v.string(_body_or_empty(request), "level", required=False, default=levels.VIEWER,
                     max_len=16)
    return json_response(await console.accounts.approve(request.key, request.params["id"], level))


async def reject(console, request) -> Response:
    reason = v.string(_body_or_empty(request), "reason", required=False, max_len=MAX_REASON)
    return json_response(await console.accounts.reject(request.key, request.params["id"], reason))


async def pairing_token(console, request) -> Response:
    ttl = v.integer(_body_or_empty(request), "ttl_seconds", lo=PAIRING_TTL_RANGE[0],
                    hi=PAIRING_TTL_RANGE[1], default=PAIRING_TTL)
    return json_response(await console.devices.issue_pairing_token(request.key.name, ttl), 201)


# ---- devices enrolling themselves ---------------------------------------------------------------

async def enroll(console, request) -> Response:
    body = request.json()
    device = await console.devices.enroll(
        v.string(body, "token", max_len=256), v.string(body, "name", max_len=64),
        v.string(body, "inference_url", max_len=512), v.string(body, "cluster_url", max_len=512),
        v.string(body, "api_key", max_len=MAX_SECRET))
    console.spawn(console.check_device(device["id"]))
    return json_response({**device, "issuer": ISSUER, "jwks": console.keys.jwks()}, 201)


# ---- reserved (spec 4.5) ------------------------------------------------------------------------

def reserved(console, request) -> Response:
    raise ApiError(ErrorKind.NOT_FOUND, f"{request.method} {request.route.path} is reserved for a "
                   "later release and is not available")


RESERVED = {route: Endpoint(reserved, PUBLIC) for route in (
    ("GET", "/api/devices/:id/audit"),
    ("POST", "/api/admin/devices"),
    ("POST", "/api/admin/device-grants"),
    ("DELETE", "/api/admin/device-grants/:id"),
    ("GET", "/api/ws/terminal/:deviceId"),
)}

ROUTES = {
    ("GET", "/api/health"): Endpoint(health, PUBLIC),
    ("GET", "/api/auth/jwks"): Endpoint(jwks, PUBLIC),
    ("POST", "/api/auth/signup"): Endpoint(signup, PUBLIC),
    ("POST", "/api/auth/login"): Endpoint(login, PUBLIC),
    ("POST", "/api/auth/refresh"): Endpoint(refresh, PUBLIC),
    ("POST", "/api/auth/logout"): Endpoint(logout, PUBLIC),
    ("GET", "/api/me"): Endpoint(me, NONE),
    ("GET", "/api/topology"): Endpoint(topology, USER),
    ("GET", "/api/devices"): Endpoint(list_devices, USER),
    ("POST", "/api/devices"): Endpoint(create_device, ADMIN),
    ("POST", "/api/devices/enroll"): Endpoint(enroll, PUBLIC),
    ("GET", "/api/devices/:id/models"): Endpoint(device_models, VIEWER),
    ("GET", "/api/devices/:id/metrics"): Endpoint(
        device_metrics, VIEWER, summary="A device's sampled metrics since `since` (epoch s; default "
        "15 minutes ago): full resolution from memory, one a minute from the database before that",
        responses={200: json_answer(dashboard.METRICS, "The samples."), 400: "'since' is not a time.",
                   404: "No device with that id."}),
    ("GET", "/api/devices/:id/requests"): Endpoint(
        device_requests, VIEWER, summary="A device's recent requests (no prompt or answer text)",
        responses={200: json_answer(dashboard.REQUESTS, "The device's answer, as it is."),
                   **dashboard.ERRORS}),
    ("GET", "/api/cluster"): Endpoint(
        dashboard.clusters, VIEWER, summary="The clusters, nodes, links and models, as the devices' "
        "last polls saw them",
        responses={200: json_answer(dashboard.CLUSTER, "The clusters and devices.")}),
    ("POST", "/api/devices/:id/exec-token"): Endpoint(exec_token, OPERATOR),
    ("POST", "/api/inference"): Endpoint(inference, VIEWER),
    ("GET", "/api/admin/users"): Endpoint(list_users, ADMIN),
    ("POST", "/api/admin/users/:id/approve"): Endpoint(approve, ADMIN),
    ("POST", "/api/admin/users/:id/reject"): Endpoint(reject, ADMIN),
    ("POST", "/api/admin/tokens"): Endpoint(pairing_token, ADMIN),
    **RESERVED,
    **static.ROUTES,
}
