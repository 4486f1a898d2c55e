"""split_mode replica over two real daemons on loopback: a model that fits one node runs as a
full copy on the leader and on the follower (each in its own engine worker), the leader routes
each request to one of them over the signed replica stream. Real SmolLM2; nothing simulated."""
from __future__ import annotations

import concurrent.futures
import http.client
import signal

import orjson
import pytest

from stackd.store import defaults
from stackd.store.store import ModelStore
from testing.cluster_nodes import eventually, statuses
from testing.daemon import CLIENT_TIMEOUT, free_port
from testing.processes import gone
from testing.two_daemons import (EMBEDDING_MODEL, FOLLOWER_HOST, MODEL, QUESTION, Pair, daemons, node_env,
                                        open_stream, assert_stream_ends_unavailable)

pytestmark = pytest.mark.slow

ROOMY_MB = 1000                 # a leader that holds SmolLM2 (about 297 MiB) alone


@pytest.fixture
def replicas(tmp_path):
    """A leader and a follower that both hold the model; the model loaded over them."""
    with daemons(tmp_path) as start_node:
        leader = start_node("leader", env=node_env(ROOMY_MB, free_port()))
        follower = start_node("follower", role="follower", leader=leader.cluster_url, host=FOLLOWER_HOST,
                              reach=FOLLOWER_HOST, env=node_env(ROOMY_MB, free_port(FOLLOWER_HOST)))
        yield Pair(leader, follower)


def load_replicas(p: Pair, **options) -> dict:
    status, _, body = p.load(**options)
    assert status == 200, body
    assert body["placement"]["split_mode"] == "replica"
    return body


def chat(p: Pair, messages=QUESTION, max_tokens: int = 24, **extra):
    return p.leader.request("POST", "/v1/chat/completions", port="inference", body={
        "model": MODEL, "messages": messages, "temperature": 0, "max_tokens": max_tokens, **extra})


def streaming(p: Pair, max_tokens: int = 400):
    """A long greedy stream with a token of it read (not only the role's first chunk)."""
    conn, response = open_stream(p.leader, max_tokens=max_tokens)
    while b'"content"' not in response.readline():
        pass
    return conn, response


def routed(p: Pair) -> dict[str, int]:
    return {r["node"]: r["requests"] for r in p.described()["replicas"]}


def test_a_replica_on_each_node_and_greedy_answers_equal_one_node(replicas):
    p = replicas
    body = load_replicas(p, replicas=1)               # the leader's copy alone: the one-node answer
    assert [r["node"] for r in body["replicas"]] == [p.leader.node_id]
    alone = p.answer()

    body = load_replicas(p, replicas="all")           # every node that can hold it (the default)
    nodes = [r["node"] for r in body["replicas"]]
    assert nodes == [p.leader.node_id, p.follower.node_id]
    assert all(r["state"] == "loaded" and r["pid"] for r in body["replicas"])
    assert [n["id"] for n in body["placement"]["nodes"]] == nodes
    follower_entry = eventually(lambda: [e for e in p.leader.get("/v1/nodes")["data"]
                                         if e["id"] == p.follower.node_id and e["replicas"]["running"]])
    assert follower_entry[0]["replicas"]["running"][0]["pid"] == body["replicas"][1]["pid"]

    # Two at once: one on each replica (the least busy first), both the one-node answer.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: p.answer(), range(4)))
    assert answers == [alone] * 4
    counts = routed(p)
    assert counts[p.follower.node_id] >= 1 and counts[p.leader.node_id] >= 1

    # A stream served by the follower: the same chunks as the leader's own copy gives.
    conn, response = open_stream(p.leader, max_tokens=8)      # holds the leader's replica
    try:
        status, _, remote = chat(p, max_tokens=8, stream=True, ignore_eos=True)
    finally:
        conn.close()
    assert status == 200
    status, _, local = chat(p, max_tokens=8, stream=True, ignore_eos=True)
    assert status == 200

    def texts(raw: bytes) -> list:
        events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
        return [(e["choices"][0]["delta"], e["choices"][0]["finish_reason"]) for e in events if e["choices"]]
    assert texts(remote) == texts(local)
    assert texts(local)


def test_prefix_affinity_sends_a_conversation_back_to_its_replica(replicas):
    p = replicas
    load_replicas(p)
    system = {"role": "system", "content": "You are a terse assistant. " * 14}   # > 64 tokens
    conn, response = open_stream(p.leader, max_tokens=400)   # the leader's replica is busy
    try:
        status, _, body = chat(p, [system, QUESTION[0]], max_tokens=4)
        assert status == 200, body
    finally:
        conn.close()
    before = routed(p)
    assert before[p.follower.node_id] == 1                 # the first went to the idle follower
    # Both idle now: without affinity the leader's copy would take it (ties go to the leader).
    eventually(lambda: all(r["in_flight"] == 0 for r in p.described()["replicas"]))
    status, _, body = chat(p, [system, {"role": "user", "content": "And of Italy?"}], max_tokens=4)
    assert status == 200, body
    assert routed(p)[p.follower.node_id] == 2


@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_a_lost_follower_costs_only_its_streaming_requests(replicas, how):
    p = replicas
    load_replicas(p)
    leader_stream = streaming(p)                              # on the leader's replica
    follower_stream = streaming(p)                            # on the follower's
    assert routed(p)[p.follower.node_id] == 1
    if how == "kill":
        p.follower.proc.send_signal(signal.SIGKILL)
        p.follower.proc.wait()
    else:
        p.follower.proc.send_signal(signal.SIGSTOP)
    # Not started yet: two at once, one of them routed to the lost follower, retried elsewhere.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: chat(p, max_tokens=8), range(2)))
    assert [status for status, _, _ in results] == [200, 200], results
    error = assert_stream_ends_unavailable(*follower_stream)
    assert p.follower.node_id in error["message"]
    leader_stream[0].close()
    p.wait_follower("down")
    assert p.state() == "loaded"
    assert [r["node"] for r in p.described()["replicas"]] == [p.leader.node_id]
    cluster = p.leader.get("/v1/cluster")
    assert cluster["status"] == "degraded"
    assert any(f"model {MODEL} lost its replica on node {p.follower.node_id}" in r for r in cluster["reasons"]), cluster
    status, _, body = chat(p)
    assert status == 200, body
    if how == "freeze":            # it comes back: it gets its replica back, the cluster heals
        p.follower.proc.send_signal(signal.SIGCONT)
        p.wait_follower("up")
        eventually(lambda: [r["node"] for r in p.described()["replicas"]] == [p.leader.node_id,
                                                                              p.follower.node_id])
        eventually(lambda: p.leader.get("/v1/cluster")["status"] == "healthy")


def test_a_follower_that_joins_later_gets_a_replica_of_the_preloaded_model(tmp_path):
    """The common case: the leader starts alone with its default models, followers join after."""
    with daemons(tmp_path) as start_node:
        leader = start_node("leader", env={**node_env(ROOMY_MB, free_port()),
                                           "STACKD_MODELS_PRELOAD": f"{MODEL},{EMBEDDING_MODEL}"})
        alone = leader.request("GET", f"/v1/models/{MODEL}", port="inference")[2]
        assert alone["state"] == "loaded" and alone["placement"]["split_mode"] == "replica"
        assert [r["node"] for r in alone["replicas"]] == [leader.node_id]       # a set of one
        embedding = leader.request("GET", f"/v1/models/{EMBEDDING_MODEL}", port="inference")[2]
        assert "replicas" not in embedding                                     # not replicated
        follower = start_node("follower", role="follower", leader=leader.cluster_url, host=FOLLOWER_HOST,
                              reach=FOLLOWER_HOST, env=node_env(ROOMY_MB, free_port(FOLLOWER_HOST)))
        p = Pair(leader, follower)
        eventually(lambda: [r["node"] for r in p.described()["replicas"]] == [leader.node_id, follower.node_id])
        assert p.described()["pid"] == alone["pid"]                   # grown, not reloaded
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: p.answer(), range(4)))
        assert len(set(answers)) == 1
        counts = routed(p)
        assert counts[leader.node_id] >= 1 and counts[follower.node_id] >= 1


def test_cluster_replicas_1_keeps_a_model_on_the_leader_alone(tmp_path):
    with daemons(tmp_path) as start_node:
        leader = start_node("leader", env={**node_env(ROOMY_MB, free_port()), "STACKD_CLUSTER_REPLICAS": "1"})
        follower = start_node("follower", role="follower", leader=leader.cluster_url, host=FOLLOWER_HOST,
                              reach=FOLLOWER_HOST, env=node_env(ROOMY_MB, free_port(FOLLOWER_HOST)))
        p = Pair(leader, follower)
        status, _, body = p.load()
        assert status == 200, body
        assert "replicas" not in body and body["placement"]["nodes"][0]["id"] == leader.node_id


def test_a_model_loaded_as_replicas_grows_onto_a_joining_follower(tmp_path):
    with daemons(tmp_path) as start_node:
        leader = start_node("leader", env=node_env(ROOMY_MB, free_port()))
        status, _, body = leader.request("POST", "/v1/models/load",
                                         body={"model": MODEL, "options": {"split_mode": "replica"}})
        assert status == 200, body
        assert [r["node"] for r in body["replicas"]] == [leader.node_id]
        follower = start_node("follower", role="follower", leader=leader.cluster_url, host=FOLLOWER_HOST,
                              reach=FOLLOWER_HOST, env=node_env(ROOMY_MB, free_port(FOLLOWER_HOST)))
        p = Pair(leader, follower)
        eventually(lambda: [r["node"] for r in p.described()["replicas"]] == [leader.node_id, follower.node_id])
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: p.answer(), range(2)))
        assert answers[0] == answers[1]
        assert routed(p)[follower.node_id] >= 1


def test_a_follower_that_gains_the_model_file_gets_a_replica(tmp_path):
    """Growth without a join: the follower is up from the start but its store lacks the model;
    once the file arrives there, the leader adds a replica at the model's next idle moment."""
    with daemons(tmp_path) as start_node:
        leader = start_node("leader", env=node_env(ROOMY_MB, free_port()))
        follower = start_node("follower", role="follower", leader=leader.cluster_url, host=FOLLOWER_HOST,
                              reach=FOLLOWER_HOST, env=node_env(ROOMY_MB, free_port(FOLLOWER_HOST)))
        p = Pair(leader, follower)
        store = ModelStore(follower.data_dir)
        digest = store.remove(MODEL).sha256

        def follower_store() -> list[str]:
            nodes = leader.request("GET", "/v1/nodes")[2]["data"]
            entry = next(n for n in nodes if n["id"] == follower.node_id)
            return (entry.get("replicas") or {}).get("store") or []

        eventually(lambda: digest not in follower_store())
        status, _, body = p.load(split_mode="replica")
        assert status == 200, body
        assert [r["node"] for r in body["replicas"]] == [leader.node_id]     # nothing to run it there
        store.import_file(MODEL, defaults.smollm2_path(), source="default")
        eventually(lambda: [r["node"] for r in p.described()["replicas"]] == [leader.node_id, follower.node_id])
        assert p.answer()


def test_the_replica_stream_refuses_a_client_without_the_secret(replicas):
    p = replicas
    load_replicas(p)
    body = orjson.dumps({"replica_id": "x", "owner": 0, "stop": [], "jobs": [[[1, 2, 3], 4, {}]]})
    path = "/internal/v1/replica/generate"
    for headers in ({}, {"Authorization": f"Bearer {p.follower.admin_key}"},
                    p.follower.signed("POST", path, body, secret="not-the-cluster-secret-0123456789")):
        conn = http.client.HTTPConnection(p.follower.reach, p.follower.cluster_port, timeout=CLIENT_TIMEOUT)
        conn.request("POST", path, body=body, headers={**headers, "Content-Type": "application/json"})
        response = conn.getresponse()
        answer = orjson.loads(response.read())
        conn.close()
        assert response.status == 401, answer
        assert answer["error"]["type"] == "authentication_error" and answer["error"]["code"] == 401
    for path in ("/internal/v1/replica/start", "/internal/v1/replica/stop"):
        status, _, answer = p.follower.request("POST", path, body={"replica_id": "x"}, key=None)
        assert status == 401 and answer["error"]["type"] == "authentication_error"
    # Signed, but for a replica that does not run there: a spec-shaped 503, nothing streamed.
    status, _, answer = p.follower.request("POST", path.replace("stop", "generate"), key=None, body=body,
                                           headers=p.follower.signed("POST", "/internal/v1/replica/generate", body))
    assert status == 503 and answer["error"]["type"] == "service_unavailable_error", answer


def test_a_follower_that_leaves_is_dropped_from_the_set_and_the_cluster_stays_healthy(replicas):
    p = replicas
    load_replicas(p)
    assert p.follower.stop() == 0                          # SIGTERM: it says it leaves
    eventually(lambda: p.follower.node_id not in statuses(p.leader))
    eventually(lambda: [r["node"] for r in p.described()["replicas"]] == [p.leader.node_id])
    cluster = p.leader.get("/v1/cluster")
    assert cluster["status"] == "healthy" and cluster["reasons"] == [], cluster
    status, _, body = chat(p)
    assert status == 200, body


def test_a_follower_stops_a_replica_its_leader_does_not_hold(replicas):
    """Fencing's orphan rule for replicas: one the leader no longer lists in its heartbeat
    answers (it marked the node down, restarted, or its replica/stop never came) stops there."""
    p = replicas
    body = load_replicas(p)
    held = body["replicas"][1]["pid"]
    sha256 = p.described()["sha256"]
    path = "/internal/v1/replica/start"
    start = orjson.dumps({"replica_id": "orphan-1", "model": MODEL, "sha256": sha256, "context_length": 256})
    status, _, answer = p.follower.request("POST", path, key=None, body=start,
                                           headers=p.follower.signed("POST", path, start))
    assert status == 200, answer
    orphan = answer["pid"]

    def running() -> dict:
        return {r["replica_id"]: r["pid"] for r in p.follower.request(
            "GET", "/internal/v1/replica", key=None,
            headers=p.follower.signed("GET", "/internal/v1/replica"))[2]["replicas"]}
    eventually(lambda: "orphan-1" not in running())
    eventually(lambda: gone(orphan))
    assert list(running().values()) == [held] and not gone(held)     # the leader's own stays
    status, _, body = chat(p)
    assert status == 200, body
