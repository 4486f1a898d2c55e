"""A model placed over a leader and a follower in their own network namespaces, joined by a veth
link (testing.netns): the RPC traffic crosses the link through the follower's relay
only, a partition mid-stream ends the stream with the spec's error while the leader serves on,
an RPC server whose rpc/stop could not reach its follower still stops, and layers over three
nodes answer as one node does. Real daemons, real SmolLM2, real ggml RPC server children;
nothing simulated."""
from __future__ import annotations

import socket

import pytest

from stackd.system import relay
from testing.cluster_nodes import eventually, statuses
from testing.netns import CLUSTER_PORT, RPC_PORT, in_namespace, inside
from testing.processes import gone, listening
from testing.two_daemons import (FOLLOWER_OFFER_MB, MODEL, N_LAYER, ROOM_FOR_ONE_MB, TOO_SMALL_MB, Pair,
                                        assert_placed_on_both, assert_stream_ends_unavailable, daemons,
                                        load_over_both_with_room_for_one, node_env, open_stream, rpc_children,
                                        rpc_listed)

from .test_relay import ANSWER, rpc_hello

pytestmark = [pytest.mark.slow, pytest.mark.netns]


class NetnsPair(Pair):
    """The leader and its first follower (`others`: any more), each in a namespace of its own."""

    def __init__(self, net, leader, followers, leader_ns: str, follower_ns: str, follower_ip: str):
        self.net, self.leader_ns, self.follower_ns, self.follower_ip = net, leader_ns, follower_ns, follower_ip
        super().__init__(leader, followers[0])
        self.others = followers[1:]
        for other in self.others:
            eventually(lambda other=other: statuses(leader).get(other.node_id) == "up")


@pytest.fixture
def netns_pair(namespaces, tmp_path):
    """netns_pair(leader_limit_mb, followers=1, one_way=False): the leader and its followers
    each in a namespace of its own, every follower on a link to the leader. one_way: the first
    follower advertises its link's second address, which the test can make unreachable from
    the leader alone (`set_route`)."""
    def make(leader_limit_mb: int, followers: int = 1, one_way: bool = False) -> NetnsPair:
        leader_ns = namespaces.add_node("leader")
        links = []
        for n in range(followers):
            follower_ns = namespaces.add_node(f"follower{n}")
            leader_ip, follower_ip = namespaces.connect(leader_ns[0], follower_ns[0])
            if one_way and n == 0:
                follower_ip = namespaces.second_address(leader_ns[0], follower_ns[0])
            links.append((follower_ns, leader_ip, follower_ip))
        leader = start_node("leader", **in_namespace(leader_ns, links[0][1], env=node_env(leader_limit_mb)))
        started = [start_node(f"follower{n}", **in_namespace(
            follower_ns, follower_ip, role="follower", leader=f"http://{leader_ip}:{CLUSTER_PORT}",
            env=node_env(FOLLOWER_OFFER_MB))) for n, (follower_ns, leader_ip, follower_ip) in enumerate(links)]
        return NetnsPair(namespaces, leader, started, leader_ns[0], links[0][0][0], links[0][2])

    with daemons(tmp_path) as start_node:
        yield make


def assert_only_the_relay_crosses_the_link(p: NetnsPair) -> int:
    """The follower's RPC server child: ggml's server on the namespace's 127.0.0.1 only, which
    the leader's namespace cannot reach over the link; the relay, which it can, lets no RPC
    exchange through without the cluster secret."""
    (child,) = rpc_children(p.follower)
    sockets = listening(child)
    upstream = [port for address, port in sockets if address == "127.0.0.1"]
    assert upstream and sockets - {("127.0.0.1", port) for port in upstream} == {("0.0.0.0", RPC_PORT)}, sockets
    (placement_id,) = eventually(lambda: [entry["placement_id"] for entry in rpc_listed(p)])   # next heartbeat

    def from_the_leader_s_namespace():
        for port in upstream:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((p.follower_ip, port), timeout=60)
        with socket.create_connection((p.follower_ip, RPC_PORT), timeout=60) as plain:   # ggml's own client
            reply = rpc_hello(plain, limit=len(relay.MAGIC) + relay.NONCE_BYTES + ANSWER)
        assert reply.startswith(relay.MAGIC) and len(reply) == len(relay.MAGIC) + relay.NONCE_BYTES
        with pytest.raises(relay.RelayError):
            relay.dial(p.follower_ip, RPC_PORT, b"not the cluster secret", placement_id)
    inside(p.leader_ns, from_the_leader_s_namespace)
    return child


def test_a_model_split_across_namespaces_crosses_only_through_its_relay_and_outlives_a_partition(netns_pair):
    p = netns_pair(ROOM_FOR_ONE_MB)
    load_over_both_with_room_for_one(p)
    child = assert_only_the_relay_crosses_the_link(p)
    split_answer = p.answer()

    streams = [open_stream(p.leader) for _ in range(2)]     # both slots decoding when the link goes down
    p.net.set_link(p.leader_ns, p.follower_ns, up=False)
    for conn, response in streams:
        assert_stream_ends_unavailable(conn, response)
    eventually(lambda: p.state() == "loaded" and p.described()["restarts"] == 1)
    placement = p.described()["placement"]
    assert [(n["id"], n["layers"]) for n in placement["nodes"]] == [(p.leader.node_id, N_LAYER)]
    assert p.answer() == split_answer                        # layer split: byte for byte one node's
    eventually(lambda: p.follower.get("/v1/cluster")["status"] == "unavailable")   # fenced

    p.net.set_link(p.leader_ns, p.follower_ns, up=True)
    p.wait_follower("up")
    eventually(lambda: gone(child) and rpc_children(p.follower) == [] and rpc_listed(p) == [])


def test_an_rpc_server_its_leader_could_not_stop_is_stopped_by_the_follower(netns_pair):
    """The leader can no longer call the follower (a one-way partition) while the follower's
    heartbeats reach it: the follower is up and never fences. The leader's worker loses its
    relay, the model cannot be placed again (rpc/stop and rpc/start cannot reach the follower),
    and the old RPC server child goes all the same: the leader's heartbeat answers no longer
    list its placement."""
    p = netns_pair(TOO_SMALL_MB, one_way=True)
    status, _, body = p.load()
    assert status == 200, body
    assert_placed_on_both(p, body)
    (child,) = rpc_children(p.follower)

    p.net.set_route(p.leader_ns, p.follower_ns, up=False)
    eventually(lambda: p.state() == "failed")
    eventually(lambda: gone(child) and rpc_children(p.follower) == [])
    assert statuses(p.leader)[p.follower.node_id] == "up"
    assert "lost the leader" not in p.follower.logged("no longer holds placement")


def test_layers_over_three_namespaces_answer_as_the_leader_alone_does(netns_pair):
    p = netns_pair(ROOM_FOR_ONE_MB, followers=2)
    ids = [p.leader.node_id, p.follower.node_id, p.others[0].node_id]
    status, _, body = p.load(nodes=ids)                       # pinned: over all three
    assert status == 200, body
    assert [n["id"] for n in body["placement"]["nodes"]] == ids
    assert all(n["layers"] > 0 for n in body["placement"]["nodes"])
    assert sum(n["layers"] for n in body["placement"]["nodes"]) == N_LAYER
    assert [len(rpc_children(f)) for f in (p.follower, *p.others)] == [1, 1]
    three_nodes = p.answer()

    status, _, body = p.leader.request("POST", "/v1/models/unload", body={"model": MODEL})
    assert status == 200, body
    status, _, body = p.load(replicas=1)          # it fits the leader: there alone (no replicas)
    assert status == 200, body
    assert [n["id"] for n in body["placement"]["nodes"]] == [p.leader.node_id]
    assert p.answer() == three_nodes
