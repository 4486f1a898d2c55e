"""A follower whose leader lost it without the follower ever fencing itself (the leader
restarted, or marked it down, within the follower's fencing window) drops the RPC servers it
runs for the leader's old placements when the leader's answer says it (re)joined. On one loop,
no sockets: the test plays the wire (the same harness as tests/cluster/test_liveness.py).
And a follower stops the RPC servers its leader's heartbeat answers no longer list."""
from __future__ import annotations

import time

import pytest

from stackd.cluster.rpc_server import RpcServers
from stackd.cluster.rpc_devices import PlacementLedger
from testing.daemon import free_port
from tests.cluster.test_liveness import _heartbeat, _membership, pair

from .conftest import SECRET, run

pytestmark = pytest.mark.slow

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


def test_a_follower_stops_the_rpc_servers_its_leader_no_longer_lists(pair, loop, tmp_path):
    """An rpc/stop that never reached the follower (the leader could not reach it then) leaves
    no server behind: the leader's next heartbeat answer no longer lists the placement. A child
    asked for after that heartbeat left may be too new for the answer's list, and is kept."""
    leader, follower = pair
    ledger = PlacementLedger()
    leader.provide_placements(ledger.on)
    servers = RpcServers(loop, str(tmp_path / "rpc"), "127.0.0.1", free_port(), SECRET)
    follower.on_placements_listed(servers.keep_only)
    try:
        follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)))
        held, dropped = (ledger.claim(leader.self_id, [follower.self_id]) for _ in range(2))
        children = [run(loop, servers.start(pid, 1, leader.self_id)) for pid in (held, dropped)]
        sent = time.monotonic()                       # a heartbeat leaves
        ledger.release(dropped)                       # unloaded; its rpc/stop is lost
        newer = run(loop, servers.start(ledger.claim(leader.self_id, ["another-node"]), 1, leader.self_id))
        follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)), sent_at=sent)
        children[1].proc.wait(timeout=60)
        assert sorted(servers.children) == sorted([held, newer.placement_id])
        assert children[0].proc.poll() is None and newer.proc.poll() is None

        follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)),
                               sent_at=time.monotonic())   # now the newer one is judged: not ours
        newer.proc.wait(timeout=60)
        assert list(servers.children) == [held]
    finally:
        servers.stop_all()
