"""A stand-in for a device's node API, on the project's own HTTP core, with a real key store.

The console's proxy is the layer under test; this node answers what the test needs and lets
the test hold a stream between chunks (to prove chunks are relayed as they arrive) and see
when the console dropped a stream (to prove cancellation reaches the device).
"""
from __future__ import annotations

import asyncio
import os

import orjson

from stackd.auth import permissions as perm
from stackd.auth.guard import KeyGuard
from stackd.auth.keys import KeyStore
from stackd.auth.ratelimit import RateLimiter
from stackd.http.errors import ApiError, ErrorKind
from stackd.http.response import StreamingResponse, json_response
from stackd.http.routing import App, Endpoint

TOPOLOGY = {"cluster_id": "c-test", "node_count": 1, "leader": "n1",
            "nodes": [{"id": "n1", "role": "leader", "ram_gb": 8}]}


class FakeNode:
    def __init__(self, data_dir: str):
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        self.keys = KeyStore(data_dir)
        _, self.key = self.keys.create("console", frozenset({perm.ADMIN}))
        self.gates: list[asyncio.Event] = []   # stream chunk i waits for gates[i]
        self.produced = 0                      # chunks the stream produced so far
        self.cancelled = asyncio.Event()
        self.slow = 0.0                        # seconds /v1/topology takes
        self.app = App("fake-node", [self.routes()], ctx=self, guard=KeyGuard(
            self.keys, RateLimiter({})), max_body=1 << 20)

    def routes(self) -> dict:
        return {("GET", "/v1/health"): Endpoint(health, perm.CLUSTER_READ),
                ("GET", "/v1/topology"): Endpoint(topology, perm.CLUSTER_READ),
                ("GET", "/v1/models"): Endpoint(models, perm.INFERENCE),
                ("POST", "/v1/chat/completions"): Endpoint(chat, perm.INFERENCE)}


def health(node, request):
    return json_response({"status": "ok", "uptime_seconds": 1, "temperature_c": None})


async def topology(node, request):
    await asyncio.sleep(node.slow)
    return json_response(TOPOLOGY)


def models(node, request):
    return json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})


def chat(node, request):
    body = request.json()
    if body["model"] != "tiny":
        raise ApiError(ErrorKind.MODEL_NOT_FOUND, f"model {body['model']!r} not found")
    if not body.get("stream"):
        return json_response({"object": "chat.completion", "model": "tiny", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello"},
             "finish_reason": "stop"}]})
    return StreamingResponse(_events(node), b"text/event-stream")


async def _events(node):
    try:
        for i, gate in enumerate(node.gates):
            await gate.wait()
            node.produced = i + 1
            yield b"data: " + orjson.dumps({"choices": [{"delta": {"content": f"c{i}"}}]}) + b"\n\n"
        yield b"data: [DONE]\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        node.cancelled.set()
        raise
