"""Simulated followers behind the Membership interface, for placement tests on one machine.

`SoloMembership` is a leader with no followers (the real Membership in membership.py serves
every node, one-node clusters included; this is only the base of the simulation). `LoopbackPeers` adds simulated followers
whose RPC server children this same daemon starts on loopback, behind their relays, as a
follower would: placement, the relay and node loss run for real on one machine. A test harness
injects it at the daemon's composition root (daemon.run's `peers`: testing/serve.py's
--loopback-peers "f1=512,f2=512", node ids and the MiB each offers to models; "f1=512@2.5": and
its compute figure, see cluster/compute_speed.py); the daemon never imports this module.
"""
from __future__ import annotations

import os
import re

from stackd.system import readings
from stackd.cluster.membership import NodeEvents, PeerNode
from stackd.cluster.peers import PeerError  # noqa: F401  (the simulated nodes' calls raise the real one)

MIB = 1 << 20


class SoloMembership(NodeEvents):
    role = "leader"
    secret: bytes | None = None

    def __init__(self, self_id: str, host: str = "127.0.0.1", threads: int = 0, compute=None):
        super().__init__()
        self.self_id = self_id
        self.host = host
        self.threads = threads or (os.cpu_count() or 1)
        self.compute = compute               # this node's ComputeSpeed (None: not measured)

    def _me(self) -> PeerNode:
        memory = readings.meminfo()
        return PeerNode(self.self_id, "leader", "up", f"http://{self.host}", self.host,
                        memory["MemTotal"], memory["MemAvailable"], memory["MemAvailable"],
                        os.cpu_count(), self.threads, 0, {},
                        self.compute.value if self.compute is not None else 0.0)

    def nodes(self) -> list[PeerNode]:
        return [self._me()]

    async def call(self, node_id: str, method: str, path: str, body: dict | None,
                   timeout: float | None = None) -> dict:
        raise PeerError(f"no node {node_id!r} in this one-node cluster", 404)


class LoopbackPeers(SoloMembership):
    """Simulated followers hosted by this daemon: their RPC children run here, on loopback."""

    def __init__(self, self_id: str, offers: dict[str, int], servers_for, threads: int = 1,
                 compute=None, computes: dict[str, float] | None = None):
        super().__init__(self_id, "127.0.0.1", threads, compute)
        self.secret = os.urandom(32)
        self.offers = offers
        self.computes = computes or {}       # node id -> its compute figure (absent: not measured)
        self.servers_for = servers_for       # node id -> that simulated node's RpcServers
        self.down: set[str] = set()
        self.silent: set[str] = set()      # testing: up by the heartbeats' count, yet not answering

    def nodes(self) -> list[PeerNode]:
        me = self._me()
        return [me] + [PeerNode(i, "follower", "down" if i in self.down else "up", "http://127.0.0.1",
                                "127.0.0.1", mib * MIB, mib * MIB, mib * MIB, 1, 1, 0, {},
                                self.computes.get(i, 0.0))
                       for i, mib in self.offers.items()]

    def set_down(self, node_id: str) -> None:
        """Testing: the node stops answering (its children die), and the leader hears of it."""
        self.down.add(node_id)
        self.servers_for(node_id).stop_all()
        for callback in self._down_callbacks:
            callback(node_id)

    async def call(self, node_id: str, method: str, path: str, body: dict | None,
                   timeout: float | None = None) -> dict:
        if node_id not in self.offers or node_id in self.down or node_id in self.silent:
            raise PeerError(f"node {node_id!r} does not answer")
        from stackd.api.cluster.rpc import handle
        return await handle(self.servers_for(node_id), method, path, body or {})


def parse_test_peers(text: str) -> dict[str, int]:
    return {node_id: mib for node_id, (mib, _) in _parse(text).items()}


def parse_test_computes(text: str) -> dict[str, float]:
    return {node_id: compute for node_id, (_, compute) in _parse(text).items() if compute is not None}


def _parse(text: str) -> dict[str, tuple[int, float | None]]:
    """"f1=512,f2=512@2.5": node id -> (MiB offered, compute figure or None)."""
    peers = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        found = re.fullmatch(r"([A-Za-z0-9._-]{1,64})=(\d+)(?:@(\d+(?:\.\d+)?))?", item)
        if not found:
            raise ValueError(f"--loopback-peers: expected id=MiB or id=MiB@compute items, got {item!r}")
        peers[found.group(1)] = (int(found.group(2)), float(found.group(3)) if found.group(3) else None)
    return peers


def membership(facts, settings, loop, spec: str) -> "LoopbackPeers | None":
    """This node with the simulated followers `spec` names, on loopback; None for none."""
    threads = settings["engine.threads"]
    offers = parse_test_peers(spec)
    if not offers:
        return None
    from stackd.cluster.rpc_server import RpcServers

    servers: dict = {}

    def servers_for(node_id: str) -> RpcServers:
        if node_id not in servers:
            servers[node_id] = RpcServers(loop, os.path.join(settings.data_dir, "test-peers", node_id),
                                          "127.0.0.1",
                                          settings["cluster.rpc_port"] + 100 * (len(servers) + 1),
                                          membership.secret, kernels=settings["engine.kernels"],
                                          batch_invariant=settings["engine.batch_invariant"],
                                          kv_commit=settings["engine.kv_commit"])
        return servers[node_id]

    membership = LoopbackPeers(facts.node_id, offers, servers_for, threads or 1,
                               facts.compute, parse_test_computes(spec))
    return membership
