"""A cluster of real daemons on loopback: join, the views on every node, a follower's 503,
signatures on the internal routes, the secret kept secret, kill -9 and leave, leader restart."""
from __future__ import annotations

import signal
import time

import orjson
import pytest

from stackd.api.cluster import internal
from stackd.daemon import import_api
from stackd.system import readings

from testing.cluster_nodes import SECRET, Node, eventually, statuses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A leader and two followers, all up."""
    root = tmp_path_factory.mktemp("cluster")
    nodes: list[Node] = []
    try:
        leader = Node(str(root / "leader"))
        nodes.append(leader)
        for name in ("f1", "f2"):
            nodes.append(Node(str(root / name), role="follower", leader=leader.cluster_url))
        eventually(lambda: list(statuses(leader).values()) == ["up"] * 3)
        yield nodes
    finally:
        for node in nodes:
            node.kill()


def test_followers_join_and_every_node_answers_with_the_leaders_view(cluster):
    leader, f1, f2 = cluster
    topology = leader.get("/v1/topology")
    assert topology["leader"] == leader.node_id
    assert topology["node_count"] == 3
    assert [n["id"] for n in topology["nodes"]][0] == leader.node_id
    assert {n["id"]: n["role"] for n in topology["nodes"]} == {
        leader.node_id: "leader", f1.node_id: "follower", f2.node_id: "follower"}
    assert {n["id"]: n["address"] for n in topology["nodes"]} == {
        node.node_id: node.cluster_url for node in cluster}
    assert all(n["last_seen_ago_ms"] < 60_000 for n in topology["nodes"])

    status = leader.get("/v1/cluster")
    assert status["status"] == "healthy" and status["nodes_up"] == 3
    metrics = leader.request("GET", "/metrics")[2]
    assert b"stackd_cluster_nodes_up 3" in metrics and b"stackd_cluster_fenced 0" in metrics
    entries = leader.get("/v1/nodes")["data"]
    assert status["total_ram_gb"] == readings.ram_gb(sum(e["memory_total_bytes"] for e in entries))
    follower_entry = next(e for e in entries if e["id"] == f1.node_id)
    assert follower_entry["status"] == "up" and follower_entry["power_budget"]["max_mw"] > 0
    assert follower_entry["memory_available_bytes"] > 0 and follower_entry["hostname"]

    for follower in (f1, f2):
        eventually(lambda: follower.get("/v1/topology")["node_count"] == 3)
        assert follower.get("/v1/cluster")["status"] == "healthy"
        seen = follower.get("/v1/topology")
        assert seen["leader"] == leader.node_id
        assert isinstance(seen["view_age_ms"], int) and seen["view_age_ms"] >= 0
        assert {n["id"] for n in follower.get("/v1/nodes")["data"]} == {n.node_id for n in cluster}


def test_a_follower_sends_inference_and_model_management_to_the_leader(cluster):
    leader, f1, _ = cluster
    leader_url = f"http://127.0.0.1:{leader.inference_port}"
    requests = [("inference", "POST", "/v1/chat/completions",
                 {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]}),
                ("inference", "GET", "/v1/models", None),
                ("inference", "POST", "/v1/models/load", {"model": "smollm2-135m-instruct"}),
                ("cluster", "POST", "/v1/models/unload", {"model": "smollm2-135m-instruct"}),
                ("cluster", "POST", "/v1/models/pull", {"model": "smollm2"})]
    for port, method, path, body in requests:
        status, _, answer = f1.request(method, path, port=port, body=body)
        assert status == 503, (path, answer)
        assert answer["error"]["type"] == "service_unavailable_error"
        assert leader_url in answer["error"]["message"], answer
        status, _, answer = f1.request(method, path, port=port, body=body, key=None)
        assert status == 401, path                # the guard still comes first
    # cluster read routes answer on every node
    for path in ("/v1/health", "/v1/topology", "/v1/cluster", "/v1/nodes", "/v1/power/contract"):
        assert f1.request("GET", path)[0] == 200, path
    assert leader.request("GET", "/v1/models", port="inference")[0] == 200


def _internal_routes():
    import_api()                        # every module that registers internal routes, as serve does
    return sorted(internal.ROUTES)


@pytest.mark.parametrize("method,path", _internal_routes())
def test_internal_routes_take_only_fresh_signatures(cluster, method, path):
    leader, f1, _ = cluster
    for node in (leader, f1):
        body = b"{}" if method == "POST" else b""
        kinds = {
            "missing": {},
            "bad": node.signed(method, path, body, secret="another-secret-0123456789abcdef"),
            "stale": node.signed(method, path, body, now=time.time() - 30),
            "future": node.signed(method, path, body, now=time.time() + 30),
            "other body": node.signed(method, path, b'{"x": 1}'),
            "other path": node.signed(method, "/internal/v1/other", body),
        }
        for kind, headers in kinds.items():
            status, _, answer = node.request(method, path, key=None, body=body or None, headers=headers)
            assert status == 401, (kind, path, answer)
            assert answer["error"]["type"] == "authentication_error", kind
        status, _, answer = node.request(method, path, body=body or None)   # the admin API key
        assert status == 401 and "API keys are not accepted" in answer["error"]["message"]
        valid = node.signed(method, path, body)
        first = node.request(method, path, key=None, body=body or None, headers=valid)
        assert first[0] != 401, first              # accepted (200, or a 4xx about the body)
        if path == "/internal/v1/heartbeat":       # an empty heartbeat; a follower takes none
            assert first[0] == (400 if node is leader else 409), first
        replayed = node.request(method, path, key=None, body=body or None, headers=valid)
        assert replayed[0] == 401 and "replayed" in replayed[2]["error"]["message"]


def test_the_secret_is_in_no_answer_and_no_log(cluster):
    leader, f1, _ = cluster
    for node in cluster:
        for path in ("/v1/topology", "/v1/cluster", "/v1/nodes", "/v1/power/contract", "/openapi.json"):
            _, _, body = node.request("GET", path)
            assert SECRET not in (body.decode() if isinstance(body, bytes) else orjson.dumps(body).decode())
    f1.request("GET", "/internal/v1/node", key=None, headers=f1.signed("GET", "/internal/v1/node"))
    for node in cluster:
        assert SECRET not in node.log()


def test_the_power_contract_is_shared_over_the_cluster_and_followers_get_their_scale(cluster):
    leader, f1, f2 = cluster
    offer = {"module_id": "psu-1", "source_capabilities": [
        {"type": "fixed", "voltage_mv": 5000, "max_current_ma": 3000}]}        # 15 W for three nodes
    status, _, contract = leader.request("POST", "/v1/power/contract", body=offer)
    assert status == 200, contract
    allocations = {a["node_id"]: a for a in contract["allocations"]}
    assert set(allocations) == {n.node_id for n in cluster}
    assert contract["demand_mw"] == sum(a["demand_mw"] for a in allocations.values())
    assert contract["capability_mismatch"] and allocations[f1.node_id]["compute_scale"] < 1

    def own_power(node):
        path = "/internal/v1/node"
        return node.request("GET", path, key=None, headers=node.signed("GET", path))[2]["power"]
    eventually(lambda: own_power(f1) == allocations[f1.node_id])
    assert f1.request("POST", "/v1/power/contract", body=offer)[0] == 503
    eventually(lambda: f2.get("/v1/power/contract")["contract_id"] == contract["contract_id"])


def test_a_killed_follower_is_down_and_a_stopped_one_leaves(cluster):
    """Destructive: runs last in this module."""
    leader, f1, f2 = cluster
    f1.kill(signal.SIGKILL)
    eventually(lambda: statuses(leader)[f1.node_id] == "down")
    status = leader.get("/v1/cluster")
    assert status["status"] == "degraded" and status["nodes_up"] == 2
    assert any(f1.node_id in reason for reason in status["reasons"])
    in_force = leader.get("/v1/power/contract")             # shared out over the nodes up
    assert {a["node_id"] for a in in_force["allocations"]} == {leader.node_id, f2.node_id}
    eventually(lambda: f2.get("/v1/topology")["nodes"] and statuses(f2).get(f1.node_id) == "down")

    assert f2.stop() == 0
    eventually(lambda: f2.node_id not in statuses(leader))
    assert statuses(leader)[f1.node_id] == "down"


def test_followers_rejoin_a_restarted_leader_and_fence_while_it_is_gone(start_node):
    leader = start_node("leader")
    follower = start_node("follower", role="follower", leader=leader.cluster_url)
    eventually(lambda: statuses(leader).get(follower.node_id) == "up")
    eventually(lambda: follower.get("/v1/cluster")["status"] == "healthy")

    leader.kill(signal.SIGKILL)
    fenced = eventually(lambda: follower.get("/v1/cluster")["status"] == "unavailable"
                        and follower.get("/v1/cluster"))
    assert "lost its leader" in fenced["reasons"][0]
    follower.logged("fenced")
    assert follower.request("POST", "/v1/chat/completions", port="inference", body={})[0] == 503

    leader.start()                                   # same data dir, same ports
    eventually(lambda: statuses(leader).get(follower.node_id) == "up")
    eventually(lambda: follower.get("/v1/cluster")["status"] == "healthy")


def test_a_node_without_cluster_settings_is_a_one_node_cluster(start_node):
    node = start_node("alone", secret=None)
    topology = node.get("/v1/topology")
    assert topology["node_count"] == 1 and topology["nodes"][0]["role"] == "leader"
    assert topology["nodes"][0]["status"] == "up"
    assert node.get("/v1/cluster")["status"] == "healthy"
    signed = node.signed("GET", "/internal/v1/node")
    assert node.request("GET", "/internal/v1/node", key=None, headers=signed)[0] == 404
