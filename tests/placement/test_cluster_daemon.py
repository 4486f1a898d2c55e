"""The daemon places a model over the cluster: real daemon, real SmolLM2, real RPC server
children on loopback behind their relays. The followers are simulated by the daemon itself
(testing/serve.py's --loopback-peers: a one-node membership plus peers whose RPC children it starts)
until the membership branch brings real ones."""
from __future__ import annotations

import http.client
import os
import signal
import time

import orjson
import pytest

from testing.daemon import CLIENT_TIMEOUT, Daemon

from testing.processes import rpc_server_pids
from testing.two_daemons import read_until_a_token

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
# Two slots of 256 tokens: weights 94 MiB + KV 11 MiB + buffers 192 MiB, about 297 MiB alone;
# the leader offers 250, so the model only fits with a follower.
CONFIG = """
[engine]
slots = 2
context_length = 256
threads = 1
kernels = "off"
[models]
preload = []
memory_limit_mb = 250
"""
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def cluster(tmp_path):
    started = []

    def start(peers: str) -> Daemon:
        daemon = Daemon(str(tmp_path / f"data{len(started)}"), CONFIG, injected={"loopback_peers": peers})
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def load(daemon, **options):
    body = {"model": MODEL, **({"options": options} if options else {})}
    return daemon.request("POST", "/v1/models/load", key=daemon.admin_key, body=body)


def ask(daemon, max_tokens=16):
    return daemon.request("POST", "/v1/chat/completions", port="inference", key=daemon.admin_key,
                          body={"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": max_tokens})


def rpc_children(daemon, node_id: str) -> list[int]:
    """Pids of the RPC server children a simulated follower runs (its cache dir names it)."""
    return rpc_server_pids(os.path.join(daemon.data_dir, "test-peers", node_id).encode())


def test_a_model_too_large_for_the_leader_loads_over_the_cluster_and_serves(cluster):
    daemon = cluster("f1=400,f2=400")
    leader = daemon.request("GET", "/v1/topology", key=daemon.admin_key)[2]["leader"]
    status, _, body = load(daemon, nodes=[leader])             # pinned to the leader alone
    assert status == 507 and body["error"]["type"] == "insufficient_memory_error"
    status, _, body = load(daemon, nodes=[leader, "nowhere"])
    assert status == 400 and body["error"]["param"] == "options.nodes"

    status, _, body = load(daemon)
    assert status == 200, body
    placement = body["placement"]
    assert placement["split_mode"] == "layer"
    assert [n["id"] for n in placement["nodes"]] == [leader, "f1", "f2"]
    assert sum(n["layers"] for n in placement["nodes"]) == 30
    assert all(n["memory_bytes"] > 0 for n in placement["nodes"])
    listed = daemon.request("GET", f"/v1/models/{MODEL}", port="inference", key=daemon.admin_key)[2]
    assert listed["placement"] == placement
    status, _, answer = ask(daemon)
    assert status == 200 and answer["choices"][0]["message"]["content"]
    assert len(rpc_children(daemon, "f1")) == 1 and len(rpc_children(daemon, "f2")) == 1
    assert "lanes" not in placement                              # followers unmeasured: one lane
    assert own_compute(daemon) > 0                                # measured in the background

    status, _, body = load(daemon, layers=[10, 10, 10])           # counts need the nodes they are for
    assert status == 400 and body["error"]["param"] == "options.layers"
    status, _, body = load(daemon, nodes=[leader, "f1", "f2"], layers=[6, 12, 11])
    assert status == 400 and body["error"]["param"] == "options.layers"
    status, _, body = load(daemon, nodes=["f2", leader, "f1"], layers=[12, 6, 12], lanes=8)
    assert status == 200, body
    assert [(n["id"], n["layers"]) for n in body["placement"]["nodes"]] == [(leader, 6), ("f2", 12), ("f1", 12)]
    assert body["placement"]["lanes"] == 2                       # no more lanes than slots
    status, _, lanes_answer = ask(daemon)                         # greedy: the same text, however split
    assert status == 200 and lanes_answer["choices"][0]["message"] == answer["choices"][0]["message"]

    # a tensor split runs on our kernels, in shards each node cuts from its own copy of the
    # file (tests/cluster/test_tensor_split.py): with kernels off it is refused, naming why
    status, _, body = load(daemon, split_mode="tensor")
    assert status == 400 and body["error"]["param"] == "options.split_mode", body
    assert "engine.kernels" in body["error"]["message"]

    status, _, body = daemon.request("POST", "/v1/models/unload", key=daemon.admin_key, body={"model": MODEL})
    assert status == 200 and "placement" not in body
    deadline = time.monotonic() + 60
    while rpc_children(daemon, "f1") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rpc_children(daemon, "f1") == []                        # unload stops them


def own_compute(daemon) -> float:
    """The leader's compute figure in /v1/nodes, once its background measurement answered."""
    deadline = time.monotonic() + 120
    while True:
        nodes = daemon.request("GET", "/v1/nodes", key=daemon.admin_key)[2]["data"]
        compute = next(n["compute"] for n in nodes if n["role"] == "leader")
        if compute > 0 or time.monotonic() > deadline:
            return compute
        time.sleep(0.5)


# Four slots, so that two lanes keep two each; 290 MiB on the leader: not the whole model
# (about 310 MiB alone), but room for most of its layers, so compute rather than memory decides.
COMPUTE_CONFIG = CONFIG.replace("slots = 2", "slots = 4").replace("memory_limit_mb = 250", "memory_limit_mb = 290")


def test_a_layer_split_follows_measured_compute_and_gets_a_lane_per_node(tmp_path):
    daemon = Daemon(str(tmp_path / "data"), COMPUTE_CONFIG,
                    injected={"loopback_peers": "fast=400@3,even=400@1", "compute": 1})
    try:
        leader = daemon.request("GET", "/v1/topology", key=daemon.admin_key)[2]["leader"]
        assert own_compute(daemon) == 1.0                         # the test's figure, not a measurement
        # SmolLM2's output matrix is 8 layers' worth (its weights over a layer's), all on the last
        # node: with equal compute the leader takes (30 + 8) / 2 = 19 layers; with a follower three
        # times as fast, (30 + 8) / 4 = 9.5 (the remainder going to the follower's 28.5 - 8).
        status, _, body = load(daemon, nodes=[leader, "even"])
        assert status == 200, body
        assert [(n["id"], n["layers"]) for n in body["placement"]["nodes"]] == [(leader, 19), ("even", 11)]
        assert body["placement"]["lanes"] == 2                   # balanced by compute: a lane per node
        status, _, body = load(daemon, nodes=[leader, "fast"])
        assert status == 200, body
        assert [(n["id"], n["layers"]) for n in body["placement"]["nodes"]] == [(leader, 9), ("fast", 21)]
        status, _, answer = ask(daemon)
        assert status == 200 and answer["choices"][0]["message"]["content"]
        status, _, body = load(daemon, nodes=[leader, "fast"], layers=[15, 15], lanes=1)   # still overrides
        assert status == 200, body
        assert [n["layers"] for n in body["placement"]["nodes"]] == [15, 15] and "lanes" not in body["placement"]
    finally:
        daemon.stop()


def test_the_cluster_too_small_is_507(cluster):
    daemon = cluster("f1=60")
    status, _, body = load(daemon)
    assert status == 507 and body["error"]["type"] == "insufficient_memory_error"
    assert "nothing was changed" in body["error"]["message"]


def test_a_follower_killed_mid_stream_ends_the_stream_with_an_error_and_the_model_is_placed_again(cluster):
    daemon = cluster("f1=400")
    status, _, body = load(daemon)
    assert status == 200 and len(body["placement"]["nodes"]) == 2
    conn = http.client.HTTPConnection("127.0.0.1", daemon.inference_port, timeout=CLIENT_TIMEOUT)
    # drafting off: accepted drafts would end the repetitive answer before the kill lands
    conn.request("POST", "/v1/chat/completions", body=orjson.dumps({
        "model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 200, "ignore_eos": True,
        "speculative": False, "stream": True}), headers={"Authorization": f"Bearer {daemon.admin_key}",
                                                         "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    read_until_a_token(response)                 # before it, a loss is a resubmission, not an error
    (child,) = rpc_children(daemon, "f1")
    os.kill(child, signal.SIGKILL)
    rest = response.read()
    conn.close()
    events = [orjson.loads(line[6:]) for line in rest.split(b"\n") if line.startswith(b"data: {")]
    error = events[-1]["error"]
    assert error["code"] == 503 and error["type"] == "service_unavailable_error"
    assert "connection to a node" in error["message"]

    deadline = time.monotonic() + 120                              # placed again, and serving
    while True:
        status, _, answer = ask(daemon)
        if status == 200 or time.monotonic() > deadline:
            break
        assert status == 503 and answer["error"]["type"] == "service_unavailable_error"
        time.sleep(0.5)
    assert status == 200 and answer["choices"][0]["message"]["content"]
    described = daemon.request("GET", f"/v1/models/{MODEL}", port="inference", key=daemon.admin_key)[2]
    assert described["restarts"] == 1 and described["state"] == "loaded"
    assert len(rpc_children(daemon, "f1")) == 1 and child not in rpc_children(daemon, "f1")
