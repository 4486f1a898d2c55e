"""Membership's state machine on one loop, with a short liveness window: the leader's down and
up, leave, the follower's fencing and unfencing, and the callbacks other modules rely on."""
from __future__ import annotations

import asyncio
import time

import pytest

from stackd import config, daemon
from stackd.cluster import membership as membership_module
from stackd.http.errors import ApiError

from tests.answers import raises_http

SECRET = "t" * 32
WINDOW = 0.2


@pytest.fixture
def short_window(monkeypatch):
    monkeypatch.setattr(membership_module, "DOWN_AFTER", WINDOW)


def _membership(tmp_path, name: str, **env):
    settings = config.load({"data_dir": str(tmp_path / name)},
                           {"STACKD_CLUSTER_SECRET": SECRET, **env})
    return daemon.build_membership(settings)


@pytest.fixture
def pair(tmp_path, loop):
    """A leader's and a follower's membership, started on one loop (no sockets)."""
    leader = _membership(tmp_path, "leader")
    leader.start(loop, "127.0.0.1", 5381, 8080)
    follower = _membership(tmp_path, "follower", STACKD_CLUSTER_ROLE="follower",
                           STACKD_CLUSTER_LEADER="http://127.0.0.1:5381")
    follower.start(loop, "127.0.0.2", 5381, 8080, heartbeat=False)    # the test plays the wire
    yield leader, follower
    loop.run_until_complete(leader.aclose())
    loop.run_until_complete(follower.aclose())


def _heartbeat(follower) -> dict:
    return follower.heartbeat_body()


def test_the_leader_marks_a_silent_follower_down_and_up_again(short_window, pair, loop):
    leader, follower = pair
    down, changes = [], []
    leader.on_node_down(down.append)
    leader.on_change(lambda: changes.append([n.status for n in leader.nodes()]))

    answer = leader.receive_heartbeat(follower.self_id, _heartbeat(follower))
    assert answer["leader_id"] == leader.self_id and answer["inference_url"] == "http://127.0.0.1:8080"
    assert [(n.id, n.role, n.status) for n in leader.nodes()] == [
        (leader.self_id, "leader", "up"), (follower.self_id, "follower", "up")]
    peer = leader.nodes()[1]
    assert peer.address == "http://127.0.0.2:5381" and peer.host == "127.0.0.2"
    assert peer.memory_total_bytes > 0 and peer.threads >= 1 and peer.detail["id"] == follower.self_id

    loop.run_until_complete(asyncio.sleep(WINDOW * 3))
    assert down == [follower.self_id]
    assert [n.id for n in leader.nodes_up()] == [leader.self_id]
    leader.receive_heartbeat(follower.self_id, _heartbeat(follower))
    assert len(leader.nodes_up()) == 2
    assert changes == [["up", "up"], ["up", "down"], ["up", "up"]]

    assert leader.receive_leave(follower.self_id) == {"left": True}
    assert down == [follower.self_id] * 2 and len(leader.nodes()) == 1


def test_a_follower_fences_itself_without_its_leader_and_unfences(short_window, pair, loop):
    leader, follower = pair
    fenced = []
    follower.on_fenced(lambda: fenced.append(True))
    assert follower.fenced                        # until its leader answered once

    follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)))
    assert not follower.fenced and [n.id for n in follower.nodes()] == [leader.self_id, follower.self_id]
    loop.run_until_complete(asyncio.sleep(WINDOW * 3))
    assert follower.fenced and fenced == [True]
    follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)))
    assert not follower.fenced and fenced == [True]


def test_a_follower_whose_loop_froze_past_the_window_fences_before_it_takes_an_answer(
        short_window, pair, loop):
    """An answer can be handled before the overdue fencing timer runs (a SIGSTOPped node woken
    with a reply waiting): the node was out of touch longer than the window, so it fences."""
    leader, follower = pair
    fenced = []
    follower.on_fenced(lambda: fenced.append(True))
    follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)))
    time.sleep(WINDOW * 2)                         # the loop does not run: its timer is overdue
    follower.accept_answer(leader.receive_heartbeat(follower.self_id, _heartbeat(follower)))
    assert fenced == [True] and not follower.fenced
    loop.run_until_complete(asyncio.sleep(0))      # the cancelled timer does not fence again
    assert fenced == [True] and not follower.fenced


def test_the_leader_refuses_a_second_node_with_a_taken_id(pair):
    leader, follower = pair
    leader.receive_heartbeat(follower.self_id, _heartbeat(follower))
    impostor = _heartbeat(follower)
    impostor["entry"] = {**impostor["entry"], "address": "http://127.0.0.3:5381"}
    with raises_http() as err:
        leader.receive_heartbeat(follower.self_id, impostor)
    assert err.value.kind.status == 409
    with raises_http():
        leader.receive_heartbeat(leader.self_id, {"entry": {**impostor["entry"], "id": leader.self_id}})


@pytest.mark.parametrize("field,value", [
    ("id", "someone-else"), ("address", "ftp://x:1"), ("address", "http://host-without-port"),
    ("memory_total_bytes", -1), ("memory_available_bytes", "lots"), ("threads", 1.5),
    ("power_budget", {"idle_mw": 0, "max_mw": 1}), ("power_budget", None),
    ("compute", -1.0), ("compute", "fast"), ("compute", float("nan")), ("compute", True)])
def test_a_malformed_heartbeat_is_a_400_naming_the_field(pair, field, value):
    leader, follower = pair
    body = _heartbeat(follower)
    body["entry"][field] = value
    with raises_http() as err:
        leader.receive_heartbeat(follower.self_id, body)
    assert err.value.kind.status == 400 and err.value.param == f"entry.{field}"
    assert leader.nodes()[1:] == []


def test_a_heartbeat_carries_the_followers_compute(pair):
    leader, follower = pair
    body = _heartbeat(follower)
    assert body["entry"]["compute"] == 0           # this test's nodes never measured theirs
    body["entry"]["compute"] = 7.25
    leader.receive_heartbeat(follower.self_id, body)
    assert [n.compute for n in leader.nodes() if n.id == follower.self_id] == [7.25]


def test_a_followers_offer_grown_is_news_to_the_leader(pair):
    """A model file arriving in a follower's store, or its offer to models rising by
    OFFER_GROWTH (a model unloaded there), calls on_offer_grown; noise below it does not."""
    leader, follower = pair
    grown, changes = [], []
    leader.on_offer_grown(lambda: grown.append(True))
    leader.on_change(lambda: changes.append(True))
    step = membership_module.OFFER_GROWTH

    def beat(memory: int, store: list[str]) -> None:
        body = _heartbeat(follower)
        body["entry"] = {**body["entry"], "model_memory_bytes": memory, "replicas": {"store": store, "running": []}}
        leader.receive_heartbeat(follower.self_id, body)

    beat(10 * step, ["a"])                          # joins: a change, not growth
    assert changes == [True] and grown == []
    beat(10 * step + step - 1, ["a"])               # just under the step: noise
    assert grown == []
    beat(8 * step, ["a"])                           # the low mark follows the offer down
    beat(9 * step, ["a"])                           # a step above the low mark
    assert grown == [True]
    beat(9 * step + step // 2, ["a"])               # the mark was reset by that growth
    assert grown == [True]
    beat(9 * step, ["a", "b"])                      # a model file arrived
    assert grown == [True, True]
    beat(9 * step, ["a", "b"])
    beat(9 * step, [{"not": "a digest"}])           # a malformed store is no news and no error
    assert grown == [True, True] and changes == [True]
