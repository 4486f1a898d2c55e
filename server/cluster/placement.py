"""Where a model's layers go: the leader alone, or the cluster's nodes over ggml RPC.

Pure: nodes and the model's needs in, a Placement out (or a PlacementError). The manager
starts the RPC servers and the engine from it.

- `layer` split (the default): on the leader alone when it holds the whole model; else the
  layers are spread over the leader and the followers so that each node's part of a step takes
  as long as the others' when every node's compute is measured (the last node also computes
  the output layer: `Need.output_layers`), else in proportion to the memory each offers to
  models; no node past what it offers. The leader keeps the first layers on its
  own CPU; each follower takes a run of the following ones (llama.cpp's layer split over
  RPC devices, in the order given).
- `tensor` split: every node runs an engine on its shard of every layer (cluster/shard.py:
  attention heads by whole KV groups, FFN rows), the leader first (it schedules and samples);
  shares follow each node's measured compute (memory when a node is unmeasured), at most one
  node per KV-head group, no node past what it offers. Partial sums are exchanged node to node
  inside each step (docs/cluster.md, "Tensor parallelism").
- `nodes` pins the placement to those nodes (in that order after the leader).
- `lanes` (layer split over several nodes): the engine's lanes, contexts stepping in turn so
  that one lane's step runs on a follower while another's runs on the leader. Worth it when
  the nodes' parts of a step take about as long; when one node's part dominates, smaller steps
  only slow that node down. By default (`default_lanes`): one lane per node when the counts
  follow every node's measured compute (the parts are balanced) and each lane keeps at least
  LANE_MIN_SLOTS slots; else one.
- `layers` (layer split, with `nodes`): how many layers each of those nodes takes, as
  llama.cpp's --tensor-split sets them, instead of shares of memory. A layer split runs a step
  on the nodes in turn, so its throughput follows the slowest node's part: the last node also
  computes the output layer (on a small model, several layers' worth), and a follower may be a
  slower device. Memory still bounds every node.

Memory is an estimate: weights + KV cache spread evenly over the layers, plus one set of
compute buffers on every node that takes part.
"""
from __future__ import annotations

from dataclasses import dataclass

SPLIT_MODES = ("layer", "tensor")
LANE_MIN_SLOTS = 2      # a default lane gets at least this many slots: a lane of one slot steps
                        # one sequence, and the weights are read once per lane and step
MAX_LANES = 8           # options.lanes' bound (api/models.py)


class PlacementError(Exception):
    """`kind` is "insufficient" (the cluster cannot hold it: 507) or "invalid" (bad options: 400,
    naming the option in `param`)."""

    def __init__(self, kind: str, message: str, param: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.param = param


@dataclass(frozen=True)
class NodeOffer:
    id: str
    memory_bytes: int            # what the node offers to models now
    compute: float = 0.0         # its measured decode speed, any unit shared by all nodes
                                 # (layers per second, say); 0: not measured


@dataclass(frozen=True)
class Need:
    weights: int
    kv_cache: int
    buffers: int                 # per node that takes part
    n_layer: int
    output_layers: float = 0.0   # the output layer's work in layers' worth (its weight bytes
                                 # over a layer's): the last node of a layer split computes it
    kv_groups: int = 0           # KV heads: a tensor split's most nodes (0: unknown, no tensor split)

    @property
    def layered(self) -> int:
        return self.weights + self.kv_cache

    @property
    def per_layer(self) -> int:
        return -(-self.layered // max(1, self.n_layer))

    def of_layers(self, k: int) -> int:
        """What a node holding `k` layers needs: their share and its compute buffers."""
        return k * self.per_layer + self.buffers

    @property
    def alone(self) -> int:
        return self.layered + self.buffers


@dataclass(frozen=True)
class Share:
    node_id: str
    memory_bytes: int
    layers: int | None = None    # layer split
    share: float | None = None   # tensor split


@dataclass(frozen=True)
class Placement:
    split_mode: str              # "layer" | "tensor"
    shares: tuple[Share, ...]    # the leader first when it takes part
    pipeline: bool = False       # layer split with the leader's layers on its own loopback RPC
                                 # server too: every layer on an RPC device, which is when
                                 # llama.cpp overlaps micro-batches across the devices
    lanes: int = 1               # the engine's lanes (native/engine/engine.h): with a layer split
                                 # over several nodes, steps in flight at once, each on a node
    reason: str = ""             # why this split (a tensor split: its basis, the planner's verdict)

    @property
    def node_ids(self) -> list[str]:
        return [s.node_id for s in self.shares]

    def is_local(self, leader_id: str) -> bool:
        """Everything on the leader's own CPU: no RPC at all."""
        return self.split_mode == "layer" and self.node_ids == [leader_id]

    def describe(self) -> dict:
        nodes = []
        for s in self.shares:
            entry = {"id": s.node_id}
            if s.layers is not None:
                entry["layers"] = s.layers
            else:
                entry["share"] = round(s.share, 4)
            entry["memory_bytes"] = s.memory_bytes
            nodes.append(entry)
        out = {"split_mode": self.split_mode, "nodes": nodes}
        if self.pipeline:
            out["pipeline"] = True
        if self.lanes > 1:
            out["lanes"] = self.lanes
        if self.reason:
            out["reason"] = self.reason
        return out


def place(need: Need, nodes: list[NodeOffer], leader_id: str, split_mode: str = "layer",
          pinned: list[str] | None = None, pipeline: bool = False,
          layers: list[int] | None = None, lanes: int | None = None, slots: int = 1) -> Placement:
    """`nodes`: the nodes that are up, the leader among them. `pipeline` (layer split over
    several nodes only): the leader computes through its own loopback RPC server. `layers`:
    one count per node of `pinned`, in its order. `lanes` (layer split over several nodes
    only): the engine's lanes, at most `slots` (the engine's); None: `default_lanes`."""
    if layers is not None:
        placement = _given_layers(need, nodes, leader_id, split_mode, pinned, layers)
    else:
        placement = _place(need, nodes, leader_id, split_mode, pinned)
    if placement.split_mode == "layer" and len(placement.shares) > 1:
        if lanes is None:
            lanes = 1 if layers is not None else default_lanes(placement, nodes, slots)
        return Placement("layer", placement.shares, pipeline=pipeline, lanes=max(1, min(lanes, slots)))
    return placement


def default_lanes(placement: Placement, nodes: list[NodeOffer], slots: int) -> int:
    """A lane per node of a layer split whose counts followed every node's measured compute:
    each node's part of a step then takes about as long, so while one lane steps on a node the
    others step on the rest (docs/cluster.md "Lanes"; bench/README.md, "Cluster": two lanes beat
    one node with the parts balanced, where one lane leaves each node idle while the others work). One lane when a node is unmeasured (memory decided,
    the parts may be far apart) or when the slots would leave a lane fewer than LANE_MIN_SLOTS."""
    placed = {s.node_id for s in placement.shares}
    if any(n.compute <= 0 for n in nodes if n.id in placed):
        return 1
    wanted = min(len(placement.shares), MAX_LANES)
    return wanted if slots >= LANE_MIN_SLOTS * wanted else 1


def _place(need: Need, nodes: list[NodeOffer], leader_id: str, split_mode: str,
           pinned: list[str] | None) -> Placement:
    if split_mode not in SPLIT_MODES:
        raise PlacementError("invalid", f"'options.split_mode' must be one of {', '.join(SPLIT_MODES)}",
                             "options.split_mode")
    candidates = _candidates(nodes, leader_id, pinned)
    if split_mode == "layer":
        leader = next((n for n in candidates if n.id == leader_id), None)
        if pinned is None and leader is not None and need.alone <= leader.memory_bytes:
            return Placement("layer", (Share(leader_id, need.alone, layers=need.n_layer),))
        return _layer_split(need, candidates, every_node=pinned is not None)
    if not candidates or candidates[0].id != leader_id:
        raise PlacementError("invalid", "a tensor split includes the leader (it schedules and samples): "
                                        "name it in 'options.nodes'", "options.nodes")
    return _tensor_split(need, candidates, pinned is not None)


def _given_layers(need: Need, nodes: list[NodeOffer], leader_id: str, split_mode: str,
                  pinned: list[str] | None, layers: list[int]) -> Placement:
    if split_mode != "layer":
        raise PlacementError("invalid", "'options.layers' is for the layer split", "options.layers")
    if pinned is None or len(pinned) != len(layers):
        raise PlacementError("invalid", "'options.layers' needs 'options.nodes', one count for each of its nodes",
                             "options.layers")
    if any(k < 1 for k in layers) or sum(layers) != need.n_layer:
        raise PlacementError("invalid", f"'options.layers' must be counts of at least 1 that add up to the "
                                        f"model's {need.n_layer} layers", "options.layers")
    count = dict(zip(pinned, layers))
    shares = []
    for node in _candidates(nodes, leader_id, pinned):
        k = count[node.id]
        if need.of_layers(k) > node.memory_bytes:
            raise PlacementError("insufficient", f"{k} layers need about {_mib(need.of_layers(k))} MiB "
                                                 f"on node {node.id}, which offers {_mib(node.memory_bytes)} MiB")
        shares.append(Share(node.id, need.of_layers(k), layers=k))
    return Placement("layer", tuple(shares))


def _candidates(nodes: list[NodeOffer], leader_id: str, pinned: list[str] | None) -> list[NodeOffer]:
    by_id = {n.id: n for n in nodes}
    if pinned is None:
        ordered = [by_id[leader_id]] if leader_id in by_id else []
        return ordered + [n for n in nodes if n.id != leader_id]
    if not pinned:
        raise PlacementError("invalid", "'options.nodes' must name at least one node", "options.nodes")
    if len(set(pinned)) != len(pinned):
        raise PlacementError("invalid", "'options.nodes' names a node twice", "options.nodes")
    unknown = [n for n in pinned if n not in by_id]
    if unknown:
        raise PlacementError("invalid", f"'options.nodes': no node {unknown[0]!r} is up in this cluster",
                             "options.nodes")
    ordered = [leader_id] if leader_id in pinned else []
    return [by_id[i] for i in ordered + [i for i in pinned if i != leader_id]]


def _insufficient(need: Need, nodes: list[NodeOffer], what: str) -> PlacementError:
    offered = sum(max(0, n.memory_bytes) for n in nodes)
    return PlacementError("insufficient", f"{what} needs about {_mib(need.layered + need.buffers * len(nodes))} "
                          f"MiB on {len(nodes)} node(s) but they offer {_mib(offered)} MiB")


def _mib(n: int) -> int:
    return n >> 20


def _layer_split(need: Need, nodes: list[NodeOffer], every_node: bool = False) -> Placement:
    """`every_node` (the nodes were pinned): each takes at least a layer, even one whose measured
    compute would leave it none (a slow last node, its share all output layer)."""
    capacity = [max(0, (n.memory_bytes - need.buffers) // need.per_layer) for n in nodes]
    if sum(capacity) < need.n_layer:
        raise _insufficient(need, nodes, "the model")
    weights = _layer_weights(need, nodes)
    layers = _proportional(need.n_layer, weights, capacity)
    if every_node and 0 in layers and all(capacity) and need.n_layer >= len(nodes):
        rest = _proportional(need.n_layer - len(nodes), weights, [c - 1 for c in capacity])
        layers = [k + 1 for k in rest]
    shares = tuple(Share(n.id, need.of_layers(k), layers=k)
                   for n, k in zip(nodes, layers) if k > 0)
    return Placement("layer", shares)


def _layer_weights(need: Need, nodes: list[NodeOffer]) -> list[int]:
    """What a layer split's counts follow. When every node's compute is measured: equal time
    per step on every node, the last one also computing the output layer: with speeds c_i,
    node i takes T c_i layers and the last T c_last - output, T = (n_layer + output) / sum(c)
    (a node whose share would go below zero takes none). Otherwise: the memory each offers."""
    if len(nodes) < 2 or any(n.compute <= 0 for n in nodes):
        return [max(0, n.memory_bytes) for n in nodes]
    per_time = (need.n_layer + need.output_layers) / sum(n.compute for n in nodes)
    targets = [per_time * n.compute for n in nodes]
    targets[-1] -= need.output_layers
    return [max(0, round(t * 1000)) for t in targets]


def _proportional(total: int, weights: list[int], capacity: list[int]) -> list[int]:
    """`total` whole units over the nodes in proportion to `weights`, none above its capacity
    (largest remainders first; what a full node cannot take goes to those with room)."""
    out = [0] * len(weights)
    remaining, open_ = total, [i for i in range(len(weights)) if capacity[i] > 0]
    while remaining > 0 and open_:
        weight = sum(weights[i] for i in open_) or len(open_)
        exact = {i: remaining * (weights[i] or 1) / weight for i in open_}
        given = {i: min(int(exact[i]), capacity[i] - out[i]) for i in open_}
        left = remaining - sum(given.values())
        for i in sorted(open_, key=lambda i: (given[i] - exact[i], i)):
            if left == 0:
                break
            if out[i] + given[i] < capacity[i]:
                given[i] += 1
                left -= 1
        for i in open_:
            out[i] += given[i]
        remaining = left
        open_ = [i for i in open_ if out[i] < capacity[i]]
    return out


def _tensor_split(need: Need, nodes: list[NodeOffer], pinned: bool = False) -> Placement:
    if need.kv_groups <= 0:
        raise PlacementError("invalid", "a tensor split needs a model whose KV heads are known", "options.split_mode")
    if len(nodes) > need.kv_groups:
        if pinned:
            raise PlacementError("invalid", f"a tensor split of this model takes at most {need.kv_groups} nodes "
                                            f"(one per KV-head group)", "options.nodes")
        nodes = nodes[:1] + sorted(nodes[1:], key=lambda n: (-n.compute, -n.memory_bytes))[:need.kv_groups - 1]
    measured = all(n.compute > 0 for n in nodes)
    weights = [n.compute if measured else max(0, n.memory_bytes - need.buffers) for n in nodes]
    total = sum(weights)
    if total <= 0:
        raise _insufficient(need, nodes, "the model")
    shares = []
    for node, weight in zip(nodes, weights):
        share = weight / total
        memory = int(need.layered * share) + need.buffers
        if memory > node.memory_bytes:
            raise PlacementError("insufficient", f"a {share:.0%} shard needs about {_mib(memory)} MiB on node "
                                                 f"{node.id}, which offers {_mib(node.memory_bytes)} MiB")
        shares.append(Share(node.id, memory, share=share))
    basis = "measured compute" if measured else "memory (a node's compute is not measured yet)"
    return Placement("tensor", tuple(shares), reason=f"shards in proportion to {basis}")


def engine_split(placement: Placement, leader_id: str, n_layer: int) -> tuple[list[str], list[float], int]:
    """What the engine of a layer split gets: the nodes behind its RPC devices (in order), the
    tensor_split shares for them, and llama.cpp's n_gpu_layers. (A tensor split has no RPC
    devices: runtime/tensor_group.py.)

    llama.cpp offloads the last n_gpu_layers of the n_layer + 1 "layers" (the output layer
    counts as one) and cuts them over the devices by cumulative share; giving each follower
    its layer count, the last one +1 for the output, lands every layer where the placement
    says."""
    remote = [s for s in placement.shares if s.node_id != leader_id or placement.pipeline]
    if not remote:
        return [], [], 0
    split = [float(s.layers) for s in remote]
    split[-1] += 1.0
    return [s.node_id for s in remote], split, sum(s.layers for s in remote) + 1
