"""Nodes in their own network namespaces, joined by veth pairs: join over a real link, then a
partition (the link down: the leader marks the follower down, the follower fences itself and
reports `unavailable`) and its end (link up: the follower rejoins)."""
from __future__ import annotations

import pytest

from testing.cluster_nodes import eventually, statuses
from testing.netns import CLUSTER_PORT, INFERENCE_PORT, in_namespace

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def test_join_and_partition_over_veth_links(namespaces, start_node):   # namespaces go last
    leader_ns, follower_ns = namespaces.add_node("leader"), namespaces.add_node("follower")
    leader_ip, follower_ip = namespaces.connect(leader_ns[0], follower_ns[0])
    leader = start_node("leader", **in_namespace(leader_ns, leader_ip))
    follower = start_node("follower", **in_namespace(follower_ns, follower_ip, role="follower",
                                                     leader=f"http://{leader_ip}:{CLUSTER_PORT}"))
    eventually(lambda: statuses(leader).get(follower.node_id) == "up")
    addresses = {n["id"]: n["address"] for n in leader.get("/v1/topology")["nodes"]}
    assert addresses[follower.node_id] == f"http://{follower_ip}:{CLUSTER_PORT}"
    eventually(lambda: follower.get("/v1/cluster")["status"] == "healthy")
    status, _, answer = follower.request("GET", "/v1/models", port="inference")
    assert status == 503 and f"http://{leader_ip}:{INFERENCE_PORT}" in answer["error"]["message"]

    namespaces.set_link(leader_ns[0], follower_ns[0], up=False)
    eventually(lambda: statuses(leader)[follower.node_id] == "down")
    assert leader.get("/v1/cluster")["status"] == "degraded"
    eventually(lambda: follower.get("/v1/cluster")["status"] == "unavailable")
    follower.logged("fenced")
    assert b"stackd_cluster_fenced 1" in follower.request("GET", "/metrics")[2]

    namespaces.set_link(leader_ns[0], follower_ns[0], up=True)
    eventually(lambda: statuses(leader)[follower.node_id] == "up")
    eventually(lambda: follower.get("/v1/cluster")["status"] == "healthy")
    assert leader.get("/v1/cluster")["status"] == "healthy"
