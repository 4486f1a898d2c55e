"""Starting a placement's RPC servers on its nodes: the leader gives a follower time to start
a child (a Python process that loads ggml: about half a second here, more on a busy node),
and a start whose answer comes too late, though the follower did it, leaves no server behind
there. The follower's side is real (RpcServers, its children on loopback); only the answer's
lateness is played."""
from __future__ import annotations

import pytest

from stackd.cluster.rpc_server import RpcServers
from testing.loopback_peers import LoopbackPeers, PeerError
from stackd.cluster import rpc_devices
from stackd.cluster.placement import Placement, Share
from stackd.cluster.rpc_devices import NodeUnreachable, PlacementLedger, RpcDevices

from .conftest import run

pytestmark = pytest.mark.slow

PLACEMENT = Placement("layer", (Share("leader", 1, layers=15), Share("f1", 1, layers=15)))


class LateAnswers(LoopbackPeers):
    """A follower that does what it is asked to start, but whose answer misses the deadline."""

    def __init__(self, *args):
        super().__init__(*args)
        self.deadlines = []

    async def call(self, node_id: str, method: str, path: str, body: dict | None, timeout: float | None = None):
        answer = await super().call(node_id, method, path, body, timeout)
        if path == "/internal/v1/rpc/start":
            self.deadlines.append(timeout)
            raise PeerError(f"node {node_id!r} did not answer within {timeout} s")
        return answer


@pytest.fixture
def follower(loop, tmp_path):
    servers = {}
    membership = LateAnswers("leader", {"f1": 400}, lambda node_id: servers["f1"])
    servers["f1"] = RpcServers(loop, str(tmp_path / "f1"), "127.0.0.1", 0, membership.secret)
    yield membership, servers["f1"]
    servers["f1"].stop_all()


def test_a_start_answered_too_late_leaves_no_server_on_the_follower(loop, tmp_path, follower):
    membership, servers = follower
    leader = RpcServers(loop, str(tmp_path / "leader"), "127.0.0.1", 0, membership.secret)
    ledger = PlacementLedger()
    devices = RpcDevices(membership, leader, 1, ledger)
    with pytest.raises(NodeUnreachable) as refused:
        run(loop, devices.start(PLACEMENT, 30))
    assert refused.value.node_id == "f1"
    assert membership.deadlines == [rpc_devices.START_DEADLINE]      # not the 2 s of an ordinary call
    assert servers.listing() == [] and leader.listing() == []
    assert ledger.on("f1") == []                       # no longer listed to the follower either
