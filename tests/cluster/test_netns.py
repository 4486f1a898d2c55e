"""Nodes in their own network namespaces, joined by veth pairs: join over a real link, then a
partition (the link down: the leader marks the follower down, the follower fences itself and
reports `unavailable`) and its end (link up: the follower rejoins)."""
from __future__ import annotations

import pytest

from tests.netns import topology
from tests.netns.topology import Topology

from .nodes import Node, eventually, statuses

CLUSTER_PORT, INFERENCE_PORT = 5381, 8080       # each namespace has its own ports

pytestmark = pytest.mark.skipif(topology.available() is not None,
                                reason=topology.available() or "")


@pytest.fixture
def namespaces():
    topology.sweep()
    net = Topology()
    try:
        yield net
    finally:
        net.close()


def _node(tmp_path, net_node, name: str, advertise: str, **kwargs) -> Node:
    netns, reach = net_node
    return Node(str(tmp_path / name), host="0.0.0.0", advertise=f"http://{advertise}:{CLUSTER_PORT}",
                reach=reach, netns=netns, ports=(INFERENCE_PORT, CLUSTER_PORT), **kwargs)


def test_join_and_partition_over_veth_links(tmp_path, namespaces):
    leader_ns, follower_ns = namespaces.add_node("leader"), namespaces.add_node("follower")
    leader_ip, follower_ip = namespaces.connect(leader_ns[0], follower_ns[0])
    started: list[Node] = []
    try:
        leader = _node(tmp_path, leader_ns, "leader", leader_ip)
        started.append(leader)
        follower = _node(tmp_path, follower_ns, "follower", follower_ip, role="follower",
                         leader=f"http://{leader_ip}:{CLUSTER_PORT}")
        started.append(follower)

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
        assert "fenced" in follower.log()
        assert b"stackd_cluster_fenced 1" in follower.request("GET", "/metrics")[2]

        namespaces.set_link(leader_ns[0], follower_ns[0], up=True)
        eventually(lambda: statuses(leader)[follower.node_id] == "up")
        eventually(lambda: follower.get("/v1/cluster")["status"] == "healthy")
        assert leader.get("/v1/cluster")["status"] == "healthy"
    finally:
        for node in started:
            node.kill()
