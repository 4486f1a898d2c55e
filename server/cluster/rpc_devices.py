"""The RPC servers behind a placement's devices: started on every node that holds part of the
model before its engine starts, stopped after it closes.

A follower's server is asked for over the signed internal route (`POST /internal/v1/rpc/start`)
and reached through its relay; this node's own (tensor split, or a pipelined layer split) is a
child on loopback that the worker dials directly.
"""
from __future__ import annotations

import itertools
import os

from ..engine.core import SPLIT_MODE_LAYER
from .placement import Placement, engine_split

# Seconds the leader waits for a follower to start an RPC server child (a Python process that
# loads ggml: about half a second on a quiet node, a few on a busy one); an ordinary internal
# call's 2 s deadline would refuse a slow node that is only busy.
START_DEADLINE = 15.0


class NodeUnreachable(RuntimeError):
    """A node of the placement could not start its RPC server (down, or not answering yet)."""

    def __init__(self, node_id: str, message: str):
        super().__init__(message)
        self.node_id = node_id


class PlacementLedger:
    """The placements this leader holds RPC servers for, each with its nodes, from before the
    first rpc/start until after the last rpc/stop. Its heartbeat answers list them to each
    follower, which stops any child not listed: an rpc/stop that could not reach the follower
    (a partition, a timeout) leaves no server behind."""

    def __init__(self):
        self._numbers = itertools.count(1)
        self.held: dict[str, tuple[str, ...]] = {}

    def claim(self, me: str, node_ids) -> str:
        """A new placement id, unique within this daemon, held on these nodes."""
        placement_id = f"{me}-{os.getpid()}-{next(self._numbers)}"
        self.held[placement_id] = tuple(node_ids)
        return placement_id

    def release(self, placement_id: str) -> None:
        self.held.pop(placement_id, None)

    def on(self, node_id: str) -> list[str]:
        return [pid for pid, nodes in self.held.items() if node_id in nodes]


class RpcDevices:
    def __init__(self, membership, servers, threads: int, ledger: PlacementLedger):
        self.membership = membership
        self.servers = servers              # this node's cluster.rpc_server.RpcServers
        self.threads = threads              # this node's own server's threads
        self.ledger = ledger

    @property
    def me(self) -> str:
        return self.membership.self_id

    async def start(self, placement: Placement, n_layer: int) -> tuple[str, dict, dict]:
        """A server on every node behind one of the engine's devices. Returns the placement id,
        the worker's `rpc` (secret and peers) and the engine's split parameters."""
        device_nodes, tensor_split, n_gpu_layers = engine_split(placement, self.me, n_layer)
        placement_id = self.ledger.claim(self.me, device_nodes)
        peers, started = [], []
        try:
            for node_id in device_nodes:
                started.append(node_id)          # first: a start whose answer never came may
                peers.append(await self._start_on(node_id, placement_id))   # still finish there
        except BaseException:
            await self.stop(started, placement_id)
            raise
        split = {"split_mode": SPLIT_MODE_LAYER, "tensor_split": tensor_split, "n_gpu_layers": n_gpu_layers,
                 "n_lanes": placement.lanes}
        secret = self.membership.secret
        return placement_id, {"secret": secret.hex() if secret else "", "peers": peers}, split

    async def _start_on(self, node_id: str, placement_id: str) -> dict:
        if node_id == self.me:
            child = await self.servers.start(placement_id, self.threads, self.me, direct=True)
            return {"host": "127.0.0.1", "port": child.port, "relay": False}
        node = next((n for n in self.membership.nodes_up() if n.id == node_id), None)
        if node is None:
            raise NodeUnreachable(node_id, f"node {node_id} is not up")
        try:
            answer = await self.membership.call(node_id, "POST", "/internal/v1/rpc/start", {
                "placement_id": placement_id, "threads": max(1, node.threads), "leader_id": self.me},
                timeout=START_DEADLINE)
        except Exception as exc:
            raise NodeUnreachable(node_id, f"node {node_id} cannot start an RPC server: {exc}") from None
        return {"host": node.host, "port": int(answer["port"]), "relay": True, "placement_id": placement_id}

    async def stop(self, node_ids, placement_id: str) -> None:
        """Best effort: a node that is gone has no server left to stop, and one that could not
        be reached stops it when our next heartbeat answer no longer lists it."""
        self.ledger.release(placement_id)
        for node_id in node_ids:
            try:
                if node_id == self.me:
                    await self.servers.stop(placement_id)
                else:
                    await self.membership.call(node_id, "POST", "/internal/v1/rpc/stop",
                                               {"placement_id": placement_id})
            except Exception:
                pass
