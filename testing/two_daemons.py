"""A leader daemon and a follower daemon, real processes on loopback, for placement tests:
the follower listens on 127.0.0.2 (its own loopback address) so that what binds where can be
told apart from the ggml RPC server's 127.0.0.1. Helpers to find a daemon's RPC server
children and to read a stream cut short by a node's loss (what a process listens on, whether
it is gone: processes.py)."""
from __future__ import annotations

import http.client
import signal
from contextlib import contextmanager

import orjson

from .cluster_nodes import Node, eventually, statuses
from .daemon import CLIENT_TIMEOUT
from .processes import rpc_server_pids, send

MODEL = "smollm2-135m-instruct"
N_LAYER = 30
FOLLOWER_HOST = "127.0.0.2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Two slots of 256 tokens: weights 94 MiB + KV 11 MiB + buffers 192 MiB, about 297 MiB alone.
ENGINE = {"STACKD_ENGINE_SLOTS": "2", "STACKD_ENGINE_CONTEXT_LENGTH": "256", "STACKD_ENGINE_THREADS": "1",
          "STACKD_ENGINE_KERNELS": "off"}
FOLLOWER_OFFER_MB = 400
# The leader offers 250 MiB to models: SmolLM2 with 2 slots of 256 needs about 297 alone.
TOO_SMALL_MB = 250
# 540 MiB hold SmolLM2 alone, but not beside the embedding model (about 279 MiB).
ROOM_FOR_ONE_MB = 540
EMBEDDING_MODEL = "all-minilm-l6-v2"


def node_env(limit_mb: int, rpc_port: int | None = None) -> dict:
    """A node's settings: the engine above, what it offers to models, its first RPC port."""
    env = {**ENGINE, "STACKD_MODELS_MEMORY_LIMIT_MB": str(limit_mb)}
    if rpc_port is not None:
        env["STACKD_CLUSTER_RPC_PORT"] = str(rpc_port)
    return env


class Pair:
    """A leader and its follower, once the leader counts the follower up."""

    def __init__(self, leader: Node, follower: Node):
        self.leader, self.follower = leader, follower
        self.wait_follower("up")

    def wait_follower(self, status: str) -> None:
        eventually(lambda: statuses(self.leader).get(self.follower.node_id) == status)

    def load(self, model: str = MODEL, **options):
        body = {"model": model, **({"options": options} if options else {})}
        return self.leader.request("POST", "/v1/models/load", body=body)

    def ask(self, max_tokens: int = 24):
        return self.leader.request("POST", "/v1/chat/completions", port="inference", body={
            "model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": max_tokens})

    def answer(self) -> str:
        status, _, body = self.ask()
        assert status == 200, body
        return body["choices"][0]["message"]["content"]

    def described(self) -> dict:
        return self.leader.request("GET", f"/v1/models/{MODEL}", port="inference")[2]

    def state(self) -> str:
        return self.described()["state"]


@contextmanager
def daemons(tmp_path):
    """start_node(name, **Node kwargs): every daemon started is killed at the end, pass or fail
    (a frozen one is woken first), and with it its RPC server children (they die with their
    parent)."""
    started: list[Node] = []

    def start_node(name: str, **kwargs) -> Node:
        node = Node(str(tmp_path / name), **kwargs)
        started.append(node)
        return node

    try:
        yield start_node
    finally:
        for node in started:
            children = rpc_children(node) if node.proc.poll() is None else []
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
            node.kill()
            for pid in children:
                send(pid, signal.SIGKILL)


# ---- what the leader says -------------------------------------------------------------------------

def assert_placed_on_both(p: Pair, body: dict) -> None:
    placement = body["placement"]
    assert placement["split_mode"] == "layer"
    assert [n["id"] for n in placement["nodes"]] == [p.leader.node_id, p.follower.node_id]
    assert all(n["layers"] > 0 and n["memory_bytes"] > 0 for n in placement["nodes"])
    assert sum(n["layers"] for n in placement["nodes"]) == N_LAYER
    assert p.described()["placement"] == placement


def load_over_both_with_room_for_one(p: Pair) -> None:
    """A leader with ROOM_FOR_ONE_MB: the chat model placed over both nodes all the same (the
    embedding model takes the leader's room while it loads, then goes), so that after the
    follower's loss the leader can hold it alone."""
    status, _, body = p.load(EMBEDDING_MODEL)
    assert status == 200, body
    status, _, body = p.load()
    assert status == 200, body
    assert_placed_on_both(p, body)
    status, _, body = p.leader.request("POST", "/v1/models/unload", body={"model": EMBEDDING_MODEL})
    assert status == 200, body


def rpc_listed(p: Pair) -> list[dict]:
    """The follower's RPC server children, as its heartbeats tell the leader."""
    (entry,) = [e for e in p.leader.get("/v1/nodes")["data"] if e["id"] == p.follower.node_id]
    return entry["rpc"]


# ---- processes and sockets -------------------------------------------------------------------------

def rpc_children(node: Node) -> list[int]:
    """Pids of the ggml RPC server children of one daemon."""
    return rpc_server_pids(parent=node.proc.pid)


# ---- a stream cut short ----------------------------------------------------------------------------

def open_stream(node: Node, max_tokens: int = 200) -> tuple[http.client.HTTPConnection, object]:
    """A greedy chat stream that runs long, read up to its first token: the model is decoding,
    and a loss from here on ends the stream with an error (a request that had sent no token is
    submitted again instead: engine.restart_hold). Drafting off: the answer repeats itself, and
    accepted drafts would end it before a kill."""
    conn = http.client.HTTPConnection(node.reach, node.inference_port, timeout=CLIENT_TIMEOUT)
    conn.request("POST", "/v1/chat/completions", body=orjson.dumps({
        "model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True,
        "speculative": False, "stream": True}), headers={"Authorization": f"Bearer {node.admin_key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    read_until_a_token(response)
    return conn, response


def read_until_a_token(response) -> None:
    """Reads an SSE chat stream up to its first chunk with content (the role chunk has none)."""
    for line in iter(response.readline, b""):
        if line.startswith(b"data: {") and orjson.loads(line[6:])["choices"][0]["delta"].get("content"):
            return
    raise AssertionError("the stream ended before its first token")


def stream_error(conn, response) -> dict:
    """The rest of the stream: its last event must be an error; that error."""
    rest = response.read()
    conn.close()
    events = [orjson.loads(line[6:]) for line in rest.split(b"\n") if line.startswith(b"data: {")]
    assert events and "error" in events[-1], rest[-500:]
    return events[-1]["error"]


def assert_stream_ends_unavailable(conn, response) -> dict:
    error = stream_error(conn, response)
    assert error["code"] == 503 and error["type"] == "service_unavailable_error", error
    return error
