"""Where a model goes and whether it fits: the context length, the memory estimate, admission on
this node, and the placement over the cluster (cluster/placement.py does the arithmetic).

A load that does not fit is refused here, before anything is allocated (507, nothing changed);
options that cannot be honoured are 400s naming the option.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Callable

from ..cluster.link_model import (DEFAULT_RATE_GBIT, LOOPBACK_RATE_GBIT, PAYS_AT, TensorCost,
                                  seconds_per_token, tensor_cost)
from ..cluster.placement import NodeOffer, Need, Placement, PlacementError, Share, place
from ..engine.config import EngineConfig, kv_bytes
from ..errors import Code, DomainError, invalid
from ..store.gguf_check import GGUFError, check_gguf
from ..store.store import Manifest, StoreError
from ..system import readings

MIB = 1 << 20
MIN_CONTEXT = 32
BUFFER_OVERHEAD = 192 * MIB     # compute graph, output logits and scratch, beyond weights and KV


def kv_bytes_per_token(m: Manifest, kv_type: str = "f16") -> int:
    """K and V for every layer: 2 * n_layer rows of n_embd_kv values of `kv_type` (f16: 2
    bytes a value; q8_0: 34 bytes a block of 32, 1.0625)."""
    if not (m.n_layer and m.n_embd):
        return 0
    n_embd_kv = m.n_embd * (m.n_head_kv or m.n_head or 1) // (m.n_head or 1)
    return 2 * m.n_layer * kv_bytes(n_embd_kv, kv_type)


@dataclass(frozen=True)
class PlacementOptions:
    """A load's placement options (POST /v1/models/load `options`, validated by api/models.py),
    keeping only what changes something: the defaults said out loud, or a pipeline or lanes on
    a one-node cluster, are the same load as none."""
    split_mode: str | None = None       # "layer" | "tensor" | "replica"
    nodes: tuple[str, ...] | None = None
    pipeline: bool = False
    layers: tuple[int, ...] | None = None
    lanes: int | None = None            # None: the placement's default (placement.default_lanes)
    replicas: int | str | None = None   # "all" or a count (None: the setting cluster.replicas)

    @classmethod
    def of(cls, options: dict, alone: bool) -> "PlacementOptions":
        split_mode = options.get("split_mode")
        nodes, layers = options.get("nodes"), options.get("layers")
        return cls(split_mode=None if split_mode == "layer" else split_mode,
                   nodes=tuple(nodes) if nodes is not None else None,
                   pipeline=bool(options.get("pipeline")) and not alone,
                   layers=tuple(layers) if layers is not None else None,
                   lanes=None if alone else options.get("lanes"),
                   replicas=options.get("replicas"))

    def asked(self) -> dict:
        """What was asked beyond the defaults (a model's description shows it)."""
        defaults = PlacementOptions()
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in asdict(self).items() if value != getattr(defaults, name)}

    @property
    def default(self) -> bool:
        return self == PlacementOptions()


@functools.lru_cache(maxsize=32)
def _output_layers(path: str, n_layer: int) -> float:
    try:
        info = check_gguf(path)
    except GGUFError:
        return 0.0
    return info.output_elements * n_layer / info.block_elements if info.block_elements else 0.0


class Planner:
    def __init__(self, config: EngineConfig, memory_reserve: int, memory_limit: int,
                 placed_here: Callable[[str], int], replicas: int | str = "all",
                 model_path: Callable[[Manifest], str] | None = None, membership=None):
        self.config = config
        self.model_path = model_path                # a manifest's file (None: no output estimate)
        self.replicas = replicas                    # cluster.replicas: "all" or how many
        self.memory_reserve = memory_reserve
        self.memory_limit = memory_limit            # models.memory_limit_mb; 0 = all
        self.placed_here = placed_here              # bytes the loaded models hold on a node
        self.membership = membership                # the cluster; None: this node alone

    @property
    def self_id(self) -> str:
        return self.membership.self_id if self.membership is not None else "self"

    def alone(self) -> bool:
        return self.membership is None or len(self.membership.nodes_up()) < 2

    def context_for(self, manifest: Manifest, requested: int | None) -> int:
        trained = manifest.context_length or self.config.context_length
        if requested is None:
            return max(MIN_CONTEXT, min(self.config.context_length, trained))
        if requested < MIN_CONTEXT or requested > trained:
            raise invalid(f"'options.context_length' must be from {MIN_CONTEXT} to the model's trained "
                          f"context, {trained}; got {requested}", "options.context_length")
        return requested

    def kv_type_for(self, requested: str | None) -> str:
        """The load's options.kv_type (validated by api/models.py), else engine.kv_type."""
        return requested or self.config.kv_type

    def estimate(self, manifest: Manifest, context_length: int, kv_type: str | None = None) -> dict[str, int]:
        slots = self.config.slots if manifest.kind == "chat" else 0
        kv_type = self.kv_type_for(kv_type)
        return {"weights": manifest.size,
                "kv_cache": slots * context_length * kv_bytes_per_token(manifest, kv_type),
                "buffers": BUFFER_OVERHEAD}

    def admit(self, manifest: Manifest, context_length: int, kv_type: str | None = None) -> None:
        """On this node alone: 507 unless the whole estimate fits what it offers."""
        kv_type = self.kv_type_for(kv_type)
        parts = self.estimate(manifest, context_length, kv_type)
        needed = sum(parts.values())
        free = self.own_offer()
        if needed > free:
            limit = (f" and a limit of {self.memory_limit // MIB} MiB for models (models.memory_limit_mb)"
                     if self.memory_limit else "")
            raise DomainError(Code.INSUFFICIENT_MEMORY,
                              f"loading '{manifest.id}' with a context of {context_length} needs about "
                              f"{needed // MIB} MiB (weights {parts['weights'] // MIB}, KV cache "
                              f"{parts['kv_cache'] // MIB} as {kv_type}, buffers {parts['buffers'] // MIB}) but only "
                              f"{max(free, 0) // MIB} MiB are free after a reserve of "
                              f"{self.memory_reserve // MIB} MiB{limit}; nothing was changed")

    def own_offer(self) -> int:
        """What this node offers to models now: the available memory minus the reserve, and
        under models.memory_limit_mb less what models placed here take already."""
        free = readings.meminfo()["MemAvailable"] - self.memory_reserve
        if self.memory_limit:
            free = min(free, self.memory_limit - self.placed_here(self.self_id))
        return free

    def output_layers(self, manifest: Manifest) -> float:
        """The output layer's work in layers' worth (its weights over a layer's: a step of many
        slots is a matmul of every weight, whatever its type), which the last node of a layer
        split computes; 0 when the file cannot tell (placement then leaves it out)."""
        if self.model_path is None or not manifest.n_layer:
            return 0.0
        try:
            return _output_layers(self.model_path(manifest), manifest.n_layer)
        except StoreError:
            return 0.0

    def own_compute(self) -> float:
        """This node's measured compute as its membership reports it (0: not measured)."""
        if self.membership is None:
            return 0.0
        me = next((n for n in self.membership.nodes_up() if n.id == self.self_id), None)
        return me.compute if me is not None else 0.0

    def on_this_cpu(self, manifest: Manifest, context_length: int, kv_type: str | None = None) -> Placement:
        """The placement of a model that runs on this node's CPU alone."""
        parts = self.estimate(manifest, context_length, kv_type)
        return Placement("layer", (Share(self.self_id, sum(parts.values()), layers=manifest.n_layer or 0),))

    def plan(self, manifest: Manifest, context_length: int, options: PlacementOptions,
             excluded: set[str] = frozenset(), kv_type: str | None = None) -> Placement | None:
        """Where the model goes (None: this node's CPU alone); 507 when the cluster cannot
        hold it, 400 for options that cannot be honoured."""
        others = [] if self.membership is None else [
            n for n in self.membership.nodes_up() if n.id != self.self_id and n.id not in excluded]
        if options.split_mode == "replica":
            self.admit(manifest, context_length, kv_type)  # the leader holds a replica too
            return None
        if options.split_mode is None and options.nodes is None and options.layers is None:
            try:
                self.admit(manifest, context_length, kv_type)
                return None
            except DomainError:
                if not others or manifest.kind != "chat":
                    raise
        if manifest.kind != "chat" or not manifest.n_layer:
            raise invalid("only chat models with a known layer count are placed across nodes", "options")
        parts = self.estimate(manifest, context_length, kv_type)
        tensor = options.split_mode == "tensor"
        need = Need(parts["weights"], parts["kv_cache"], parts["buffers"], manifest.n_layer,
                    self.output_layers(manifest),
                    kv_groups=(manifest.n_head_kv or manifest.n_head or 0) if manifest.architecture == "llama" else 0)
        if tensor:
            if self.config.kernels == "off" or self.config.isolation != "worker":
                raise invalid("a tensor split runs in our kernels' workers: it needs engine.kernels = auto "
                              "and engine.isolation = worker", "options.split_mode")
            holding = self._holding(manifest, others, options.nodes)
            left_out, others = len(others) - len(holding), holding
        offers = [NodeOffer(self.self_id, self.own_offer(), self.own_compute())] + [
            NodeOffer(n.id, n.model_memory_bytes, n.compute) for n in others]
        nodes = list(options.nodes) if options.nodes is not None else None
        layers = list(options.layers) if options.layers is not None else None
        split_mode, verdict = options.split_mode or "layer", ""
        if split_mode == "tensor" or (options.split_mode is None and nodes is None and layers is None):
            split_mode, verdict = self._tensor_or_layer(manifest, offers, others, split_mode)
        try:
            placement = place(need, offers, self.self_id, split_mode, nodes,
                              options.pipeline, layers, options.lanes, max(1, self.config.slots))
            if verdict:
                placement = replace(placement, reason="; ".join(r for r in (placement.reason, verdict) if r))
            return placement
        except PlacementError as exc:
            if exc.kind == "invalid":
                raise invalid(str(exc), exc.param) from None
            without = (f" ({left_out} follower(s) could not take part: their stores do not hold this model file)"
                       if tensor and left_out else "")
            raise DomainError(Code.INSUFFICIENT_MEMORY,
                              f"loading '{manifest.id}' with a context of {context_length}: {exc}{without}; "
                              "nothing was changed") from None

    def _tensor_or_layer(self, manifest: Manifest, offers: list[NodeOffer], others: list,
                         asked: str) -> tuple[str, str]:
        """The split for a model that does not fit the leader alone (or a tensor split asked for),
        and why: tensor where the link model (cluster/link_model.py) predicts it at least
        PAYS_AT times as fast as the layer split, from each node's measured compute and the
        leader's measured round trip to each follower; layer otherwise."""
        cost = self.tensor_cost(manifest, offers)
        if asked == "tensor":
            return "tensor", (f"asked for; predicted {cost.speedup:.2f}x one node" if cost else
                              "asked for; no prediction (a node's compute or link is not measured)")
        holding = {n.id for n in self._holding(manifest, others, None)}
        if (cost is None or self.config.kernels == "off" or self.config.isolation != "worker"
                or not manifest.n_head_kv or manifest.architecture != "llama"
                or any(o.id not in holding for o in offers[1:])):
            return "layer", ""
        layer_us = cost.one_node_us + (len(offers) - 1) * max(self._rtts([o.id for o in offers[1:]]) or [0.0])
        speedup = layer_us / cost.tensor_us if cost.tensor_us > 0 else 0.0
        why = (f"predicted {cost.speedup:.2f}x one node, {speedup:.2f}x the layer split (exchange "
               f"{cost.exchange_us:.1f} us x {cost.exchanges} a token)")
        if speedup >= PAYS_AT:
            return "tensor", f"tensor chosen: {why}"
        return "layer", f"layer chosen: tensor {why}, under {PAYS_AT}x"

    def tensor_cost(self, manifest: Manifest, offers: list[NodeOffer]) -> TensorCost | None:
        """The link model's prediction for a tensor split over `offers` (the leader first); None
        while a node's compute or a link's round trip is not measured."""
        rtts = self._rtts([o.id for o in offers[1:]])
        if len(offers) < 2 or any(o.compute <= 0 for o in offers) or rtts is None or not manifest.n_embd:
            return None
        one_node_us = seconds_per_token(manifest.parameter_count or 2 * manifest.size, offers[0].compute) * 1e6
        rate = LOOPBACK_RATE_GBIT if self._on_loopback([o.id for o in offers]) else DEFAULT_RATE_GBIT
        return tensor_cost(one_node_us, [o.compute for o in offers], rtts, manifest.n_layer, manifest.n_embd,
                           rate_gbit=rate)

    def _on_loopback(self, node_ids: list[str]) -> bool:
        """Every node on this machine's loopback (a test's or a benchmark's cluster)."""
        hosts = {n.id: n.host for n in self.membership.nodes_up()} if self.membership is not None else {}
        return all(str(hosts.get(i, "")).startswith("127.") or hosts.get(i) == "::1" for i in node_ids)

    def _rtts(self, node_ids: list[str]) -> list[float] | None:
        links = getattr(getattr(self.membership, "links", None), "entry", lambda: {})()
        rtts = [links.get(node_id) for node_id in node_ids]
        return None if any(r is None for r in rtts) else [float(r) for r in rtts]

    @staticmethod
    def _holding(manifest: Manifest, others: list, pinned: tuple[str, ...] | None) -> list:
        """The followers that hold the very model file (a tensor split's follower cuts its shard
        from its own copy); a pinned node without it is a 400 naming it."""
        holding = [n for n in others if manifest.sha256 in ((n.detail.get("replicas") or {}).get("store") or ())]
        if pinned is not None:
            lacking = sorted(set(pinned) & {n.id for n in others} - {n.id for n in holding})
            if lacking:
                raise invalid(f"'options.nodes' names {lacking[0]}, whose store does not hold '{manifest.id}' "
                              f"(sha256 {manifest.sha256[:12]}...): pull it there first", "options.nodes")
        return holding

    def replicated(self, manifest: Manifest, options: PlacementOptions) -> bool:
        """Whether a model this node holds alone runs as a replica set: when the load asks
        (split_mode replica, options.replicas), and by default on the leader of a cluster (one
        with a secret, so followers can join) unless cluster.replicas is 1: a set of one at
        first, grown onto each follower that can hold it when it joins or comes back."""
        if not self._replicable(manifest, options):
            return False
        if options.split_mode == "replica" or options.replicas is not None:
            return True
        membership = self.membership
        return (self.replicas != 1 and getattr(membership, "is_leader", False)
                and bool(getattr(membership, "secret", None)))

    @staticmethod
    def _replicable(manifest: Manifest, options: PlacementOptions) -> bool:
        """A chat model, and no pinned split (layers, or nodes without split_mode replica)."""
        return (manifest.kind == "chat" and options.split_mode in (None, "replica") and options.layers is None
                and not (options.nodes is not None and options.split_mode is None))

    def replica_nodes(self, manifest: Manifest, context_length: int, options: PlacementOptions,
                      have: set[str] = frozenset(), kv_type: str | None = None) -> list[str]:
        """The followers that get a replica of a model the leader holds alone (beside the leader's
        own): every follower that is up, has the very model file in its store and offers room for
        the whole estimate, or as many as `replicas` (options.replicas, else cluster.replicas)
        asks, the roomiest first. Only chat models; none when the load pinned a split."""
        if self.membership is None or not self._replicable(manifest, options):
            return []
        wanted = options.replicas if options.replicas is not None else self.replicas
        need = sum(self.estimate(manifest, context_length, kv_type).values())
        pinned = set(options.nodes) if options.nodes is not None else None
        if pinned is not None:
            up = {n.id for n in self.membership.nodes_up()}
            missing = sorted(pinned - up - {self.self_id})
            if missing:
                raise invalid(f"'options.nodes' names {missing[0]}, which is not an up node of the cluster",
                              "options.nodes")
        candidates = []
        for node in self.membership.nodes_up():
            if node.id == self.self_id or node.id in have or (pinned is not None and node.id not in pinned):
                continue
            offer = node.detail.get("replicas") or {}
            if manifest.sha256 not in (offer.get("store") or ()):
                continue
            room = node.model_memory_bytes - self.placed_here(node.id)
            if room >= need:
                candidates.append((room, node.id))
        candidates.sort(reverse=True)
        if wanted != "all":
            candidates = candidates[:max(0, int(wanted) - 1 - len(have))]
        return [node_id for _, node_id in candidates]
