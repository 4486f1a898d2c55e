"""A tensor split's engines, the leader's side: its own worker is rank 0 of the group, each
follower runs rank 1, 2, ... on its own shard (tensor_host.py), and the workers exchange partial
sums over an authenticated mesh inside every decode step (docs/cluster.md, "Tensor
parallelism").

Starting one, in order:
1. the group id (the placement ledger's, so followers that are not told about it any more stop
   their shard), the cut (each node's weight: its share of the placement) and the vocabulary
   rows of each node;
2. the leader binds its mesh listener (the port every follower dials);
3. each follower, in rank order, is asked to start its shard; its answer is the port of its own
   listener, which the next ranks dial;
4. the leader's worker starts on shard 0 with the whole address list: it completes the mesh
   (every follower dialled in meanwhile), and only then does every engine load.
A follower that cannot be reached fails the start (NodeUnreachable: the placement is made
again without it); whatever started is stopped.
"""
from __future__ import annotations

import asyncio
import socket

from ..cluster.rpc_devices import NodeUnreachable, PlacementLedger
from ..errors import invalid
from .tensor_host import ENGINE_FIELDS, shard_cache

START_DEADLINE = 120.0          # seconds a follower has to cut its shard and spawn its worker
EXCHANGE_DEADLINE_MS = 2000     # one exchange at most: a peer silent this long is lost
# How long an exchange polls its sockets before it sleeps in poll(). Mid-step, a node waits for
# the slower node's half layer: on a 1B-class model that is often longer than a short spin, and a
# node that slept then pays a wake-up at each of 33 exchanges a token. 2 ms covers nearly every
# wait inside a step (the figures against 50 us: bench/README.md, "Cluster" and "What changed");
# an idle group still sleeps (a follower polls 1 ms
# for its next control message, then sleeps).
SPIN_US = 2000


class TensorGroups:
    def __init__(self, membership, store, ledger: PlacementLedger, bind_host: str):
        self.membership = membership
        self.store = store
        self.ledger = ledger
        self.bind_host = bind_host

    @property
    def me(self) -> str:
        return self.membership.self_id

    async def start(self, placement, manifest, model_path: str, params: dict):
        """-> (group id, the leader's shard path, its worker's `tensor` message, its listener).
        `params`: the leader's engine parameters, which every follower's engine copies."""
        from ..cluster.shard import ShardError, shard_for, vocab_cut   # numpy and gguf: on demand
        nodes = placement.node_ids
        weights = [round(s.share, 4) or 0.0001 for s in placement.shares]
        group_id = self.ledger.claim(self.me, nodes)
        loop = asyncio.get_running_loop()
        started: list[str] = []
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            try:
                leader_shard = await loop.run_in_executor(None, shard_for, model_path, weights, 0,
                                                          shard_cache(self.store), manifest.sha256)
                cut = vocab_cut(await loop.run_in_executor(None, _n_vocab, model_path), weights)
            except ShardError as exc:
                raise invalid(f"'{manifest.id}' cannot be split by tensors: {exc}", "options.split_mode") from None
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.bind_host, 0))
            listener.listen(16)
            secret = self.membership.secret or b""
            tensor = {"mesh_id": group_id, "secret": secret.hex(), "deadline_ms": EXCHANGE_DEADLINE_MS,
                      "spin_us": SPIN_US, "vocab_cut": cut}
            addresses = [[self._own_host(), listener.getsockname()[1]]]
            engine = {name: params[name] for name in ENGINE_FIELDS if name in params}
            for rank, node_id in enumerate(nodes[1:], start=1):
                started.append(node_id)
                port = await self._start_on(node_id, {
                    "group_id": group_id, "model": manifest.id, "sha256": manifest.sha256, "rank": rank,
                    "weights": weights, "addresses": addresses, "engine": engine,
                    "tensor": {k: tensor[k] for k in ("deadline_ms", "spin_us", "vocab_cut", "mesh_id")}})
                addresses = addresses + [[self._host_of(node_id), port]]
        except BaseException:
            listener.close()
            await self.stop(started, group_id)
            raise
        tensor.update(rank=0, size=len(nodes), addresses=addresses)
        return group_id, leader_shard, tensor, listener

    async def _start_on(self, node_id: str, body: dict) -> int:
        if not any(n.id == node_id for n in self.membership.nodes_up()):
            raise NodeUnreachable(node_id, f"node {node_id} is not up")
        try:
            answer = await self.membership.call(node_id, "POST", "/internal/v1/tensor/start", body,
                                                timeout=START_DEADLINE)
        except Exception as exc:
            raise NodeUnreachable(node_id, f"node {node_id} cannot start its tensor shard: {exc}") from None
        return int(answer["port"])

    async def stop(self, node_ids, group_id: str) -> None:
        """Best effort, as for RPC servers: a node that is gone has nothing left to stop, and one
        not reached stops its shard when our heartbeat answers no longer list the group."""
        self.ledger.release(group_id)
        for node_id in node_ids:
            if node_id == self.me:
                continue
            try:
                await self.membership.call(node_id, "POST", "/internal/v1/tensor/stop", {"group_id": group_id})
            except Exception:
                pass

    def _own_host(self) -> str:
        me = next((n for n in self.membership.nodes_up() if n.id == self.me), None)
        return (me.host if me is not None and me.host else None) or _reachable(self.bind_host)

    def _host_of(self, node_id: str) -> str:
        node = next((n for n in self.membership.nodes_up() if n.id == node_id), None)
        if node is None or not node.host:
            raise NodeUnreachable(node_id, f"node {node_id} has no address")
        return node.host


def _reachable(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0") else host


def _n_vocab(model_path: str) -> int:
    import gguf

    from ..cluster.shard import ShardError
    reader = gguf.GGUFReader(model_path, "r")
    for name in ("tokenizer.ggml.tokens",):
        field = reader.get_field(name)
        if field is not None:
            return len(field.data)
    raise ShardError("the model's vocabulary size is not in its GGUF")
