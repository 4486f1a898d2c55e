"""A follower whose leader lost it without the follower ever fencing itself (the leader
restarted, or marked it down, within the follower's fencing window) drops the RPC servers it
runs for the leader's old placements when the leader's answer says it (re)joined. On one loop,
no sockets: the test plays the wire (the same harness as tests/cluster/test_liveness.py)."""
from __future__ import annotations

from tests.cluster.test_liveness import _heartbeat, _membership, pair

__all__ = ["pair"]


def test_a_follower_the_leader_lost_drops_its_rpc_servers_without_having_fenced(pair, loop, tmp_path):
    leader, follower = pair
    dropped = []
    follower.on_fenced(lambda: dropped.append(True))
    follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)))
    follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)))
    assert dropped == []                           # a first join and an ordinary heartbeat keep them

    leader._silent(follower.self_id)               # marked down; the follower's window not yet over
    follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)))
    assert dropped == [True] and not follower.fenced

    restarted = _membership(tmp_path, "leader")    # the same leader, back before the follower fenced
    restarted.start(loop, "127.0.0.1", 5381, 8080)
    try:
        follower.accept_answer(restarted.receive_heartbeat(follower.self_id, _heartbeat(follower)))
        assert dropped == [True, True] and not follower.fenced
    finally:
        loop.run_until_complete(restarted.aclose())
