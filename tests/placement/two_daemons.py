"""A leader daemon and a follower daemon, real processes on loopback, for placement tests:
the follower listens on 127.0.0.2 (its own loopback address) so that what binds where can be
told apart from the ggml RPC server's 127.0.0.1. Helpers to find a daemon's RPC server
children, what they listen on, and to read a stream cut short by a node's loss."""
from __future__ import annotations

import http.client
import os
import signal
import socket

import orjson
import pytest

from tests.blackbox.daemon import CLIENT_TIMEOUT
from tests.cluster.nodes import EVENTUAL, Node, eventually, free_port, statuses

from .processes import rpc_server_pids

MODEL = "smollm2-135m-instruct"
N_LAYER = 30
FOLLOWER_HOST = "127.0.0.2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Two slots of 256 tokens: weights 94 MiB + KV 11 MiB + buffers 192 MiB, about 297 MiB alone.
ENGINE = {"STACKD_ENGINE_SLOTS": "2", "STACKD_ENGINE_CONTEXT_LENGTH": "256", "STACKD_ENGINE_THREADS": "1",
          "STACKD_ENGINE_KERNELS": "off"}
FOLLOWER_OFFER_MB = 400


class Pair:
    def __init__(self, start_node, leader_limit_mb: int):
        self.start_node = start_node
        self.leader = start_node("leader", env={**ENGINE, "STACKD_MODELS_MEMORY_LIMIT_MB": str(leader_limit_mb),
                                                "STACKD_CLUSTER_RPC_PORT": str(free_port())})
        self.follower = start_node("follower", role="follower", leader=self.leader.cluster_url,
                                   host=FOLLOWER_HOST, reach=FOLLOWER_HOST,
                                   env={**ENGINE, "STACKD_MODELS_MEMORY_LIMIT_MB": str(FOLLOWER_OFFER_MB),
                                        "STACKD_CLUSTER_RPC_PORT": str(free_port(FOLLOWER_HOST))})
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


@pytest.fixture
def pair(tmp_path):
    """pair(leader_limit_mb): every daemon started is killed at the end, pass or fail (a frozen
    one is woken first), and with it its RPC server children (they die with their parent)."""
    started: list[Node] = []

    def start_node(name: str, **kwargs) -> Node:
        node = Node(str(tmp_path / name), **kwargs)
        started.append(node)
        return node

    yield lambda leader_limit_mb: Pair(start_node, leader_limit_mb)
    for node in started:
        children = rpc_children(node) if node.proc.poll() is None else []
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGCONT)
        node.kill()
        for pid in children:
            send(pid, signal.SIGKILL)


# ---- processes and sockets -------------------------------------------------------------------------

def rpc_children(node: Node) -> list[int]:
    """Pids of the ggml RPC server children of one daemon."""
    return rpc_server_pids(parent=node.proc.pid)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every IPv4 TCP socket the process listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    out = set()
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            address, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:                    # 0A: LISTEN
                ip, port = address.split(":")
                out.add((socket.inet_ntoa(bytes.fromhex(ip)[::-1]), int(port, 16)))
    return out


def send(pid: int, signum: int) -> None:
    """A signal to a process that may be gone already."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"    # a zombie is gone too
    except OSError:
        return True


# ---- a stream cut short ----------------------------------------------------------------------------

def open_stream(node: Node, max_tokens: int = 200) -> tuple[http.client.HTTPConnection, object]:
    """A greedy chat stream that runs long, with its first chunk read: the model is decoding."""
    conn = http.client.HTTPConnection(node.reach, node.inference_port, timeout=CLIENT_TIMEOUT)
    conn.request("POST", "/v1/chat/completions", body=orjson.dumps({
        "model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True,
        "stream": True}), headers={"Authorization": f"Bearer {node.admin_key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    return conn, response


def stream_error(conn, response) -> dict:
    """The rest of the stream: its last event must be an error; that error."""
    rest = response.read()
    conn.close()
    events = [orjson.loads(line[6:]) for line in rest.split(b"\n") if line.startswith(b"data: {")]
    assert events and "error" in events[-1], rest[-500:]
    return events[-1]["error"]


__all__ = ["EVENTUAL", "eventually", "statuses"]
