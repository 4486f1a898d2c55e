"""Proxying to devices: topology, models, inference (whole, streamed, failing, cancelled)."""
from __future__ import annotations

import asyncio
import socket
import struct

import orjson
import pytest

from testing.fake_node import TOPOLOGY

pytestmark = pytest.mark.slow


@pytest.fixture
def viewer(shared):
    if "proxy-viewer" not in [a.username for a in shared.console.directory.accounts.values()]:
        shared.add_user("proxy-viewer", "viewer")
    return shared.login("proxy-viewer", "password-123")["access_token"]


@pytest.fixture
def device(shared):
    existing = [d for d in shared.run(shared.console.devices.listing()) if d["name"] == "proxied"]
    return existing[0] if existing else shared.add_device("proxied")


def test_topology_is_the_coordinators(shared, viewer):
    status, _, body = shared.call("GET", "/api/topology", viewer)
    assert status == 200 and body == TOPOLOGY


def test_topology_when_the_coordinator_is_down(fresh):
    with socket.socket() as sock:            # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    harness = fresh()
    harness.console.settings.coordinator = f"http://127.0.0.1:{dead}"
    status, headers, body = harness.call("GET", "/api/topology", harness.admin_token())
    assert status == 503 and body["error"]["type"] == "service_unavailable_error"
    assert "coordinator" in body["error"]["message"] and headers["retry-after"]


def test_topology_when_the_coordinator_is_slow(fresh):
    harness = fresh(upstream_timeout=0.5)
    harness.node.slow = 3.0
    status, _, body = harness.call("GET", "/api/topology", harness.admin_token())
    assert status == 503 and "did not answer within 0.5 s" in body["error"]["message"]


def test_device_models(shared, viewer, device):
    status, _, body = shared.call("GET", f"/api/devices/{device['id']}/models", viewer)
    assert status == 200 and body["data"][0]["id"] == "tiny"
    status, _, body = shared.call("GET", "/api/devices/dev_unknown/models", viewer)
    assert status == 404


def test_inference_whole_answer(shared, viewer, device):
    status, _, body = shared.call("POST", "/api/inference", viewer, {
        "device_id": device["id"], "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "hello"


def test_inference_keeps_the_devices_error(shared, viewer, device):
    status, _, body = shared.call("POST", "/api/inference", viewer, {
        "device_id": device["id"], "model": "absent", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404
    assert body["error"] == {"code": 404, "type": "model_not_found",
                             "message": "model 'absent' not found"}


@pytest.mark.parametrize("body,param", [
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, "device_id"),
    ({"device_id": "d", "messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"device_id": "d", "model": "tiny", "messages": []}, "messages"),
])
def test_inference_validates(shared, viewer, body, param):
    status, _, answer = shared.call("POST", "/api/inference", viewer, body)
    assert status == 400 and answer["error"]["param"] == param


def _open_stream(shared, token: str, device_id: str):
    conn = shared.connect()
    conn.request("POST", "/api/inference", body=orjson.dumps({
        "device_id": device_id, "model": "tiny", "stream": True,
        "messages": [{"role": "user", "content": "hi"}]}),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    return conn, conn.getresponse()


def _read_event(response) -> bytes:
    lines = []
    while True:
        line = response.fp.readline()      # chunk size line, data, CRLF: read raw SSE lines
        if line.startswith(b"data: "):
            lines.append(line)
        if line == b"\n" and lines:
            return b"".join(lines)


def test_stream_is_relayed_chunk_by_chunk(shared, viewer, device):
    gates = []

    def arm():
        gates.extend(asyncio.Event() for _ in range(3))
        shared.node.gates = gates
        shared.node.produced = 0
    shared.loop.call_soon_threadsafe(arm)
    shared.run(asyncio.sleep(0))
    conn, response = _open_stream(shared, viewer, device["id"])
    assert response.status == 200
    assert response.getheader("content-type").startswith("text/event-stream")
    shared.call_soon(gates[0].set)
    first = response.read1(65536)
    # the first chunk is in our hands while the device has produced only it
    assert b"c0" in first and shared.node.produced == 1
    shared.call_soon(gates[1].set)
    shared.call_soon(gates[2].set)
    rest = response.read()
    assert b"c1" in rest and b"c2" in rest and b"[DONE]" in rest
    conn.close()


def test_client_disconnect_cancels_the_upstream_request(shared, viewer, device):
    gates = []

    def arm():
        gates.extend(asyncio.Event() for _ in range(3))
        shared.node.gates = gates
        shared.node.cancelled.clear()
        shared.node.produced = 0
    shared.loop.call_soon_threadsafe(arm)
    shared.run(asyncio.sleep(0))
    conn, response = _open_stream(shared, viewer, device["id"])
    shared.call_soon(gates[0].set)
    assert b"c0" in response.read1(65536)
    # the client goes away mid-stream: an abortive close (RST), as a killed client's. (A FIN
    # alone is a half-close the protocol answers to the end; the first write after it fails.)
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.sock.close()
    response.close()
    conn.close()
    shared.run(asyncio.wait_for(shared.node.cancelled.wait(), 60))
    assert shared.node.produced == 1               # nothing more was produced for nobody
