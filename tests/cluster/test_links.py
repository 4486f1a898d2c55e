"""Each node's measured round trip to its peers (server/cluster/links.py): the measurement on
real sockets, the probe over a membership's entries, the heartbeat's check of a follower's
figures, and two real daemons whose /v1/cluster lists the link both ways."""
from __future__ import annotations

import socket
import time

import pytest

from stackd import config, daemon
from stackd.cluster import links, views
from testing.cluster_nodes import EVENTUAL

from tests.answers import raises_http

SECRET = "l" * 32


def test_a_connect_round_trip_is_measured_and_a_closed_port_has_none():
    listener = socket.create_server(("127.0.0.1", 0))
    host, port = listener.getsockname()
    try:
        rtt = links.connect_rtt_us(host, port)
        assert rtt is not None and rtt > 0
    finally:
        listener.close()
    assert links.connect_rtt_us(host, port, samples=2) is None        # nothing listens now


class Entries:
    """A membership as the probe reads it: its id and its nodes' entries."""

    def __init__(self, entries):
        self.self_id, self.entries = "me", entries

    def node_entries(self):
        return self.entries


def test_the_probe_measures_the_peers_that_are_up_and_forgets_those_gone(loop):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    membership = Entries([
        {"id": "me", "status": "up", "address": f"http://127.0.0.1:{port}"},
        {"id": "peer", "status": "up", "address": f"http://127.0.0.1:{port}"},
        {"id": "down", "status": "down", "address": f"http://127.0.0.1:{port}"},
        {"id": "nowhere", "status": "up", "address": "http://127.0.0.1:1"}])
    probe = links.LinkProbe(membership)
    try:
        loop.run_until_complete(probe.sweep())
        assert list(probe.entry()) == ["peer"] and probe.entry()["peer"] > 0
        membership.entries = membership.entries[:1]
        loop.run_until_complete(probe.sweep())
        assert probe.entry() == {}
    finally:
        listener.close()


@pytest.fixture
def pair(tmp_path, loop):
    """A leader's and a follower's membership on one loop; the test plays the heartbeats."""
    def build(name, **env):
        return daemon.build_membership(config.load({"data_dir": str(tmp_path / name)},
                                                   {"STACKD_CLUSTER_SECRET": SECRET, **env}))
    leader = build("leader")
    leader.start(loop, "127.0.0.1", 5381, 8080)
    follower = build("follower", STACKD_CLUSTER_ROLE="follower", STACKD_CLUSTER_LEADER="http://127.0.0.1:5381")
    follower.start(loop, "127.0.0.2", 5381, 8080, heartbeat=False)
    yield leader, follower
    loop.run_until_complete(leader.aclose())
    loop.run_until_complete(follower.aclose())


def test_a_followers_figures_reach_the_leaders_cluster_view(pair):
    leader, follower = pair
    beat = follower.heartbeat_body()
    beat["entry"] = {**beat["entry"], "links": {leader.self_id: 41.5, "node-other": 80}}
    leader.receive_heartbeat(follower.self_id, beat)
    listed = views.current(leader, "cluster")["links"]
    assert {"from": follower.self_id, "to": leader.self_id, "rtt_us": 41.5} in listed
    assert {"from": follower.self_id, "to": "node-other", "rtt_us": 80} in listed


@pytest.mark.parametrize("value", ["fast", [1], {"a": -1}, {"a": "1"}, {"a": float("nan")}, {"": 1},
                                   {"a": True}, {f"n{i}": 1 for i in range(links.MAX_LINKS + 1)}])
def test_a_heartbeat_with_malformed_figures_is_refused(pair, value):
    leader, follower = pair
    beat = follower.heartbeat_body()
    beat["entry"] = {**beat["entry"], "links": value}
    with raises_http() as err:
        leader.receive_heartbeat(follower.self_id, beat)
    assert err.value.kind.status == 400 and "entry.links" in err.value.message


def test_two_daemons_measure_their_link_both_ways(start_node):
    leader = start_node("leader")
    follower = start_node("follower", role="follower", leader=leader.cluster_url, host="127.0.0.2",
                          reach="127.0.0.2")
    deadline = time.monotonic() + EVENTUAL
    while True:
        listed = {(link["from"], link["to"]): link["rtt_us"] for link in leader.get("/v1/cluster")["links"]}
        if (leader.node_id, follower.node_id) in listed and (follower.node_id, leader.node_id) in listed:
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.2)
    assert all(rtt > 0 for rtt in listed.values())
    entry = next(n for n in leader.get("/v1/nodes")["data"] if n["id"] == leader.node_id)
    assert follower.node_id in entry["links"]
