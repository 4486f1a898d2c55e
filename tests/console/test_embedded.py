"""The console beside a real node (`serve --console`, what `make run` does), real model included."""
from __future__ import annotations

import http.client
import os
import stat
import time

import orjson
import pytest

from testing.console_embedded import NO_MODELS, EmbeddedDaemon

pytestmark = pytest.mark.slow


def call(port: int, method: str, path: str, token: str | None = None, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=orjson.dumps(body) if body is not None else None,
                 headers=headers)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    kind = response.getheader("content-type", "")
    return response.status, orjson.loads(raw) if kind.startswith("application/json") else raw


def login(daemon) -> str:
    status, body = call(daemon.port, "POST", "/api/auth/login",
                        body={"username": "admin", "password": daemon.admin_password})
    assert status == 200, body
    return body["access_token"]


def own_device(daemon, token: str, online: bool = True) -> dict:
    deadline = time.monotonic() + 120
    while True:
        status, listing = call(daemon.port, "GET", "/api/devices", token)
        assert status == 200 and len(listing["data"]) == 1
        device = listing["data"][0]
        if not online or device["status"] == "online" or time.monotonic() > deadline:
            return device
        time.sleep(0.2)


def test_first_start_registers_the_node_and_proxies_to_it(embedded_daemon):
    daemon = embedded_daemon
    for name in ("console-admin.password", "console-node.key"):
        assert stat.S_IMODE(os.stat(os.path.join(daemon.data_dir, name)).st_mode) == 0o600
    assert any("console admin password written to" in line for line in daemon.stdout)
    token = login(daemon)
    device = own_device(daemon, token)
    assert device["status"] == "online" and device["name"].startswith("node-")
    assert device["cluster_url"] == f"http://127.0.0.1:{daemon.ports['cluster']}"
    status, topology = call(daemon.port, "GET", "/api/topology", token)
    assert status == 200 and topology["leader"] == device["name"]
    status, models = call(daemon.port, "GET", f"/api/devices/{device['id']}/models", token)
    assert status == 200 and "smollm2-135m-instruct" in [m["id"] for m in models["data"]]


def test_device_scoped_inference_with_the_real_model(embedded_daemon):
    daemon = embedded_daemon
    token = login(daemon)
    device = own_device(daemon, token)
    request = {"device_id": device["id"], "model": "smollm2-135m-instruct", "max_tokens": 8,
               "temperature": 0, "messages": [{"role": "user", "content": "Say hello."}]}
    status, whole = call(daemon.port, "POST", "/api/inference", token, request)
    assert status == 200 and whole["choices"][0]["message"]["content"]
    status, streamed = call(daemon.port, "POST", "/api/inference", token, {**request, "stream": True})
    events = [line[6:] for line in streamed.split(b"\n") if line.startswith(b"data: ")]
    assert status == 200 and events[-1] == b"[DONE]"
    text = "".join(orjson.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if orjson.loads(e)["choices"])
    assert text == whole["choices"][0]["message"]["content"]      # greedy: the same words
    status, error = call(daemon.port, "POST", "/api/inference", token,
                         {**request, "model": "no-such-model"})
    assert status == 404 and error["error"]["type"] == "model_not_found"


def test_restart_keeps_the_console_and_registers_nothing_twice(tmp_path):
    data_dir = str(tmp_path / "data")
    daemon = EmbeddedDaemon(data_dir, NO_MODELS)
    try:
        token = login(daemon)
        first = own_device(daemon, token, online=False)
        password = daemon.admin_password
        status, _ = call(daemon.port, "POST", "/api/auth/signup",
                         body={"username": "kept-user", "password": "password-123"})
        assert status == 201
    finally:
        assert daemon.stop() == 0
    daemon = EmbeddedDaemon(data_dir, NO_MODELS)
    try:
        assert daemon.admin_password == password
        assert not any("console admin password written" in line for line in daemon.stdout)
        token = login(daemon)
        assert own_device(daemon, token, online=False)["id"] == first["id"]
        status, pending = call(daemon.port, "GET", "/api/admin/users?state=pending", token)
        assert [u["username"] for u in pending["data"]] == ["kept-user"]
        assert own_device(daemon, token)["status"] == "online"   # its node key still works
    finally:
        assert daemon.stop() == 0
