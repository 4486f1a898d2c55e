"""A model placed over two real daemons, a leader and a follower (each its own process and data
dir, on loopback, with the cluster secret), and the follower lost in the middle of a stream:
killed (kill -9, the daemon and its RPC server child) or frozen (SIGSTOP, its sockets open).
Real SmolLM2, real ggml RPC server children behind their relays; nothing simulated."""
from __future__ import annotations

import os
import signal

import pytest

from testing.cluster_nodes import eventually
from testing.processes import gone, listening, send
from testing.two_daemons import (FOLLOWER_HOST, MODEL, N_LAYER, ROOM_FOR_ONE_MB, TOO_SMALL_MB, Pair,
                                        assert_placed_on_both, assert_stream_ends_unavailable,
                                        load_over_both_with_room_for_one, open_stream, rpc_children, rpc_listed)

pytestmark = pytest.mark.slow


def assert_one_rpc_child_behind_its_relay(p: Pair) -> int:
    """The follower runs one RPC server child: its relay on the follower's own address, the
    ggml server itself on 127.0.0.1 only."""
    (child,) = rpc_children(p.follower)
    relay, *others = sorted(listening(child), key=lambda a: a[0] != FOLLOWER_HOST)
    assert relay[0] == FOLLOWER_HOST
    assert others and all(address == "127.0.0.1" for address, _ in others), listening(child)
    return child


def assert_views_show_the_model(p: Pair) -> None:
    """/v1/topology and /v1/cluster on both nodes: two nodes up, the leader, the placed model."""
    ids = {p.leader.node_id, p.follower.node_id}
    for node in (p.leader, p.follower):
        def shown(node=node):
            topology, cluster = node.get("/v1/topology"), node.get("/v1/cluster")
            assert topology["node_count"] == 2 and topology["leader"] == p.leader.node_id
            assert {n["id"] for n in topology["nodes"]} == ids
            assert all(n["status"] == "up" for n in topology["nodes"])
            assert cluster["status"] == "healthy" and cluster["total_ram_gb"] > 0
            return cluster["active_model"] == MODEL          # a follower's view: its next heartbeat
        eventually(shown)


def kill_follower(p: Pair) -> None:
    """kill -9 of the follower daemon and of its RPC server child, together."""
    children = rpc_children(p.follower)
    assert len(children) == 1
    p.follower.proc.send_signal(signal.SIGKILL)
    for pid in children:
        send(pid, signal.SIGKILL)                            # it may have gone with its parent
    p.follower.proc.wait()
    eventually(lambda: all(gone(pid) for pid in children))


def assert_failed_naming(p: Pair, node_id: str) -> None:
    """The model is `failed` with a reason naming the lost node; inference is a clear 503."""
    eventually(lambda: p.state() == "failed")
    assert node_id in p.described()["error"]
    status, _, body = p.ask()
    assert status == 503 and body["error"]["type"] == "service_unavailable_error"
    assert node_id in body["error"]["message"]
    cluster = p.leader.get("/v1/cluster")
    assert cluster["status"] == "degraded" and any(node_id in r for r in cluster["reasons"])


def test_a_model_over_two_daemons_fails_when_its_follower_dies_and_uses_it_again_once_back(pair):
    p = pair(TOO_SMALL_MB)
    status, _, body = p.load()
    assert status == 200, body
    assert_placed_on_both(p, body)
    assert_one_rpc_child_behind_its_relay(p)
    split_answer = p.answer()
    assert split_answer
    assert_views_show_the_model(p)

    conn, response = open_stream(p.leader)                   # kill -9 in the middle of a stream
    kill_follower(p)
    assert_stream_ends_unavailable(conn, response)
    p.wait_follower("down")
    assert_failed_naming(p, p.follower.node_id)              # the leader alone cannot hold it

    p.follower.start()                                       # back: a new load uses it again
    p.wait_follower("up")
    status, _, body = p.load()
    assert status == 200, body
    assert_placed_on_both(p, body)
    assert p.answer() == split_answer


def test_a_frozen_follower_is_dropped_fenced_and_rejoins_with_nothing_of_the_old_placement(pair):
    p = pair(TOO_SMALL_MB)
    status, _, body = p.load()
    assert status == 200, body
    old_child = assert_one_rpc_child_behind_its_relay(p)
    eventually(lambda: [c["pid"] for c in rpc_listed(p)] == [old_child])

    conn, response = open_stream(p.leader)         # SIGSTOP of the whole node: sockets open, nothing answers
    frozen = [p.follower.proc.pid, old_child]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        error = assert_stream_ends_unavailable(conn, response)   # the leader's worker does not hang:
        assert f"node {p.follower.node_id} went down" in error["message"]   # the heartbeats' verdict
        p.wait_follower("down")
        assert_failed_naming(p, p.follower.node_id)
    finally:
        for pid in frozen:
            send(pid, signal.SIGCONT)
    # Awake, it finds it lost its leader: fenced, it stops its RPC children, then rejoins.
    eventually(lambda: gone(old_child) and rpc_children(p.follower) == [])
    p.follower.logged("fenced")                   # however its loop ordered the wake-up
    p.wait_follower("up")
    eventually(lambda: rpc_listed(p) == [])                  # what its heartbeats say, too
    status, _, body = p.load()
    assert status == 200, body
    assert_placed_on_both(p, body)
    new_child = assert_one_rpc_child_behind_its_relay(p)
    assert new_child != old_child and p.answer()


def test_a_killed_follower_s_model_is_placed_again_on_the_leader_and_answers_the_same(pair):
    p = pair(ROOM_FOR_ONE_MB)
    load_over_both_with_room_for_one(p)
    split_answer = p.answer()

    conn, response = open_stream(p.leader)
    kill_follower(p)
    assert_stream_ends_unavailable(conn, response)
    eventually(lambda: p.state() == "loaded" and p.described()["restarts"] == 1)
    described = p.described()
    assert [n["id"] for n in described["placement"]["nodes"]] == [p.leader.node_id]
    assert described["placement"]["nodes"][0]["layers"] == N_LAYER
    assert p.answer() == split_answer                        # layer split: byte for byte one node's
    p.wait_follower("down")


def test_a_leader_restarted_at_once_leaves_no_rpc_server_of_its_old_placements_on_the_follower(pair):
    """A leader back within the follower's fencing window (3 s) lost every model it had placed
    (they were in its processes): the follower never fenced, so the leader's rejoin answer tells
    it to drop what it serves for the leader's old life."""
    p = pair(TOO_SMALL_MB)
    status, _, body = p.load()
    assert status == 200, body
    old_child = assert_one_rpc_child_behind_its_relay(p)
    p.leader.kill()                                          # kill -9, then back on the same ports
    p.leader.start()
    p.wait_follower("up")
    eventually(lambda: gone(old_child) and rpc_children(p.follower) == [])
    status, _, body = p.load()                               # and the follower serves the new leader
    assert status == 200, body
    assert_placed_on_both(p, body)
    assert p.answer()


def test_a_frozen_rpc_server_under_a_live_follower_ends_the_stream_and_the_model_is_placed_again(pair):
    """Only the RPC server child frozen (SIGSTOP), its daemon heartbeating on: no heartbeat
    verdict comes, and the kernel still acknowledges what the worker sends, so llama.cpp would
    wait forever; the dialer's probe finds the relay silent and the worker gives up."""
    p = pair(TOO_SMALL_MB)
    status, _, body = p.load()
    assert status == 200, body
    old_child = assert_one_rpc_child_behind_its_relay(p)
    conn, response = open_stream(p.leader)
    os.kill(old_child, signal.SIGSTOP)
    try:
        assert_stream_ends_unavailable(conn, response)
        eventually(lambda: p.state() == "loaded" and p.described()["restarts"] == 1)
    finally:
        send(old_child, signal.SIGCONT)
    assert_placed_on_both(p, p.described())                  # the follower is still up: used again
    eventually(lambda: gone(old_child))                       # the frozen server was stopped
    assert assert_one_rpc_child_behind_its_relay(p) != old_child
    assert p.answer()
