"""The planner's rule between a tensor and a layer split (runtime/planner.py with
cluster/link_model.py): for a model that does not fit the leader alone, tensor where the link
model predicts it PAYS_AT times as fast as the layer split from the nodes' measured compute and
the leader's measured round trips, layer otherwise; and a placement says which and why."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from stackd.cluster.link_model import PAYS_AT
from stackd.cluster.placement import NodeOffer
from stackd.engine.config import EngineConfig
from stackd.runtime.planner import Planner
from stackd.store.store import Manifest

pytestmark = pytest.mark.slow

MODEL = Manifest(id="m", file="blobs/sha256-" + "a" * 64, size=98_000_000, sha256="a" * 64, architecture="llama",
                 kind="chat", quantization="Q4_1", parameter_count=134_000_000, context_length=2048,
                 n_layer=30, n_embd=576, n_head_kv=3, n_head=9)


@dataclass
class FakeNode:
    id: str
    host: str
    compute: float
    detail: dict = field(default_factory=lambda: {"replicas": {"store": ["a" * 64]}})


class FakeLinks:
    def __init__(self, rtts: dict[str, float]):
        self.rtts = rtts

    def entry(self) -> dict[str, float]:
        return dict(self.rtts)


class FakeMembership:
    def __init__(self, nodes: list[FakeNode], rtts: dict[str, float]):
        self.self_id = nodes[0].id
        self.nodes = nodes
        self.links = FakeLinks(rtts)

    def nodes_up(self):
        return self.nodes


def planner(nodes, rtts, kernels="auto") -> Planner:
    p = Planner(EngineConfig(kernels=kernels), 0, 0, lambda node_id: 0)
    p.membership = FakeMembership(nodes, rtts)
    return p


def offers(nodes) -> list[NodeOffer]:
    return [NodeOffer(n.id, 1 << 30, n.compute) for n in nodes]


def test_a_fast_link_chooses_tensor_and_says_why():
    nodes = [FakeNode("L", "10.0.0.1", 10.0), FakeNode("F", "10.0.0.2", 10.0)]
    p = planner(nodes, {"F": 20.0})
    mode, why = p._tensor_or_layer(MODEL, offers(nodes), nodes[1:], "layer")
    assert mode == "tensor" and why.startswith("tensor chosen: predicted"), why


def test_a_slow_link_keeps_the_layer_split():
    nodes = [FakeNode("L", "10.0.0.1", 10.0), FakeNode("F", "10.0.0.2", 10.0)]
    mode, why = planner(nodes, {"F": 2000.0})._tensor_or_layer(MODEL, offers(nodes), nodes[1:], "layer")
    assert mode == "layer" and f"under {PAYS_AT}x" in why, why


def test_no_measurement_no_file_or_no_kernels_keeps_the_layer_split():
    nodes = [FakeNode("L", "10.0.0.1", 10.0), FakeNode("F", "10.0.0.2", 10.0)]
    assert planner(nodes, {})._tensor_or_layer(MODEL, offers(nodes), nodes[1:], "layer") == ("layer", "")
    unmeasured = [FakeNode("L", "10.0.0.1", 10.0), FakeNode("F", "10.0.0.2", 0.0)]
    assert planner(unmeasured, {"F": 20.0})._tensor_or_layer(
        MODEL, offers(unmeasured), unmeasured[1:], "layer") == ("layer", "")
    lacking = [FakeNode("L", "10.0.0.1", 10.0), FakeNode("F", "10.0.0.2", 10.0, detail={})]
    assert planner(lacking, {"F": 20.0})._tensor_or_layer(MODEL, offers(lacking), lacking[1:], "layer")[0] == "layer"
    nodes_off = planner(nodes, {"F": 20.0}, kernels="off")
    assert nodes_off._tensor_or_layer(MODEL, offers(nodes), nodes[1:], "layer")[0] == "layer"


def test_a_tensor_split_asked_for_says_its_prediction():
    nodes = [FakeNode("L", "127.0.0.1", 10.0), FakeNode("F", "127.0.0.2", 10.0)]
    mode, why = planner(nodes, {"F": 15.0})._tensor_or_layer(MODEL, offers(nodes), nodes[1:], "tensor")
    assert mode == "tensor" and why.startswith("asked for; predicted") and "x one node" in why
    mode, why = planner(nodes, {})._tensor_or_layer(MODEL, offers(nodes), nodes[1:], "tensor")
    assert mode == "tensor" and "no prediction" in why


def test_loopback_links_cost_no_wire_time():
    loopback = [FakeNode("L", "127.0.0.1", 10.0), FakeNode("F", "127.0.0.2", 10.0)]
    ethernet = [FakeNode("L", "10.0.0.1", 10.0), FakeNode("F", "10.0.0.2", 10.0)]
    near = planner(loopback, {"F": 15.0}).tensor_cost(MODEL, offers(loopback))
    far = planner(ethernet, {"F": 15.0}).tensor_cost(MODEL, offers(ethernet))
    assert near.exchange_us < far.exchange_us and near.speedup > far.speedup
