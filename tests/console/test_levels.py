"""Every endpoint of the /api group at every level: allowed at and above its level, 403 below,
401 without credentials (a table: 5 levels x every endpoint, on both databases)."""
from __future__ import annotations

import itertools

import pytest

pytestmark = pytest.mark.slow

LEVELS = ["none", "user", "viewer", "operator", "admin"]
RANK = {level: rank for rank, level in enumerate(LEVELS)}
_names = itertools.count()

# (method, path template, required level, body factory or None, status when allowed)
ENDPOINTS = [
    ("GET", "/api/me", "none", None, 200),
    ("GET", "/api/topology", "user", None, 200),
    ("GET", "/api/devices", "user", None, 200),
    ("POST", "/api/devices", "admin", lambda w: {
        "name": f"dev-{next(_names)}", "inference_url": w.node_url, "cluster_url": w.node_url,
        "api_key": w.node.key}, 201),
    ("GET", "/api/devices/{device}/models", "viewer", None, 200),
    ("POST", "/api/devices/{device}/exec-token", "operator", None, 201),
    ("POST", "/api/inference", "viewer", lambda w: {
        "device_id": w.device["id"], "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}]}, 200),
    ("GET", "/api/admin/users?state=pending", "admin", None, 200),
    ("POST", "/api/admin/users/{target}/approve", "admin", lambda w: {"level": "user"}, 200),
    ("POST", "/api/admin/users/{target}/reject", "admin", lambda w: {"reason": "no"}, 200),
    ("POST", "/api/admin/tokens", "admin", lambda w: {}, 201),
]

OPEN = [
    ("GET", "/api/health", 200),
    ("GET", "/api/auth/jwks", 200),
    ("GET", "/", 200),
]

RESERVED = [
    ("GET", "/api/devices/{device}/audit"),
    ("POST", "/api/admin/devices"),
    ("POST", "/api/admin/device-grants"),
    ("DELETE", "/api/admin/device-grants/g1"),
    ("GET", "/api/ws/terminal/{device}"),
]


class World:
    """One user per level, a device and a spare account to approve and reject."""

    def __init__(self, harness):
        self.harness = harness
        self.node_url = harness.node_url
        self.node = harness.node
        self.device = harness.add_device("levels-device")
        self.tokens = {"admin": harness.admin_token()}
        for level in ("user", "viewer", "operator"):
            harness.add_user(f"lv-{level}", level)
            self.tokens[level] = harness.login(f"lv-{level}", "password-123")["access_token"]
        harness.add_user("lv-pending", None)
        self.tokens["none"] = harness.login("lv-pending", "password-123")["access_token"]
        self.target = harness.add_user("lv-target", None)["id"]

    def path(self, template: str) -> str:
        return template.format(device=self.device["id"], target=self.target)


@pytest.fixture(scope="module")
def world(shared):
    shared.node.gates = []
    return World(shared)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("method,path,needed,body,allowed_status", ENDPOINTS,
                         ids=[f"{m} {p}" for m, p, *_ in ENDPOINTS])
def test_endpoint_at_level(world, level, method, path, needed, body, allowed_status):
    status, _, answer = world.harness.call(method, world.path(path), world.tokens[level],
                                           body(world) if body else None)
    if RANK[level] >= RANK[needed]:
        assert status == allowed_status, answer
    else:
        assert status == 403, answer
        assert answer["error"]["type"] == "permission_error"
        assert f"level '{needed}'" in answer["error"]["message"]


@pytest.mark.parametrize("method,path,needed,body,allowed_status", ENDPOINTS,
                         ids=[f"{m} {p}" for m, p, *_ in ENDPOINTS])
def test_endpoint_without_credentials(world, method, path, needed, body, allowed_status):
    status, headers, answer = world.harness.call(method, world.path(path), None,
                                                 body(world) if body else None)
    assert status == 401
    assert answer["error"] == {"code": 401, "type": "authentication_error",
                               "message": "missing access token: send 'Authorization: Bearer "
                                          "<access_token>'"}
    assert headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("level", LEVELS + [None])
@pytest.mark.parametrize("method,path,status", OPEN)
def test_open_endpoints_at_every_level(world, level, method, path, status):
    token = world.tokens[level] if level else None
    assert world.harness.call(method, path, token)[0] == status


@pytest.mark.parametrize("level", LEVELS + [None])
@pytest.mark.parametrize("method,path", RESERVED)
def test_reserved_endpoints_are_404_saying_so(world, level, method, path):
    token = world.tokens[level] if level else None
    status, _, answer = world.harness.call(method, world.path(path), token)
    assert status == 404
    assert answer["error"]["type"] == "not_found_error"
    assert "reserved for a later release" in answer["error"]["message"]


def test_unknown_api_path_is_a_plain_404(world):
    status, _, answer = world.harness.call("GET", "/api/nothing", world.tokens["admin"])
    assert status == 404 and "no such endpoint" in answer["error"]["message"]
