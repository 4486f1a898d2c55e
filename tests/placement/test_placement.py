"""Placement, table-driven: where the layers go for given memory offers."""
from __future__ import annotations

import pytest

from stackd.cluster.placement import (NodeOffer, Need, Placement, PlacementError, Share, engine_split, place)

pytestmark = pytest.mark.slow

MIB = 1 << 20
# 30 layers of 10 MiB each (weights + KV), 20 MiB of buffers per node: 320 MiB alone
NEED = Need(weights=240 * MIB, kv_cache=60 * MIB, buffers=20 * MIB, n_layer=30, kv_groups=3)


def nodes(**offers_mib) -> list[NodeOffer]:
    return [NodeOffer(node_id, mib * MIB) for node_id, mib in offers_mib.items()]


LAYER_CASES = [
    # (offers, pinned, expected layers per node in order)
    ({"L": 4000, "F1": 4000}, None, [("L", 30)]),                         # fits the leader alone
    ({"L": 320, "F1": 4000}, None, [("L", 30)]),                          # exactly fits
    ({"L": 319, "F1": 319}, None, [("L", 15), ("F1", 15)]),               # equal memory: halves
    ({"L": 220, "F1": 420}, None, [("L", 10), ("F1", 20)]),               # 1:2 -> 10:20
    ({"L": 100, "F1": 400, "F2": 500}, None, [("L", 3), ("F1", 12), ("F2", 15)]),
    ({"L": 60, "F1": 2000}, None, [("L", 1), ("F1", 29)]),               # 60:2000 of 30 layers
    ({"L": 60, "F1": 300}, None, [("L", 4), ("F1", 26)]),                # 5 would overflow the leader
    ({"L": 10, "F1": 4000}, None, [("F1", 30)]),                          # leader under its buffers
    ({"L": 4000, "F1": 4000, "F2": 4000}, ["F2", "F1"], [("F2", 15), ("F1", 15)]),   # pinned order
    ({"L": 4000, "F1": 4000}, ["F1", "L"], [("L", 15), ("F1", 15)]),      # the leader goes first
    ({"L": 4000, "F1": 4000}, ["L"], [("L", 30)]),
]


@pytest.mark.parametrize("offers, pinned, expected", LAYER_CASES)
def test_layer_split(offers, pinned, expected):
    placement = place(NEED, nodes(**offers), "L", "layer", pinned)
    assert placement.split_mode == "layer"
    assert [(s.node_id, s.layers) for s in placement.shares] == expected
    for share in placement.shares:
        assert share.memory_bytes <= offers[share.node_id] * MIB or len(placement.shares) == 1


@pytest.mark.parametrize("offers", [{"L": 100, "F1": 100}, {"L": 319}, {"L": 0, "F1": 0}, {"L": 200, "F1": 20}])
def test_what_the_cluster_cannot_hold_is_insufficient(offers):
    with pytest.raises(PlacementError) as caught:
        place(NEED, nodes(**offers), "L")
    assert caught.value.kind == "insufficient"
    assert "MiB" in str(caught.value)


@pytest.mark.parametrize("pinned, message", [
    (["X"], "no node 'X'"), ([], "at least one"), (["F1", "F1"], "twice")])
def test_bad_pins_are_invalid(pinned, message):
    with pytest.raises(PlacementError) as caught:
        place(NEED, nodes(L=4000, F1=4000), "L", "layer", pinned)
    assert caught.value.kind == "invalid" and message in str(caught.value)


def test_unknown_split_mode_is_invalid():
    with pytest.raises(PlacementError) as caught:
        place(NEED, nodes(L=4000), "L", "row")
    assert caught.value.kind == "invalid"


TENSOR_CASES = [
    ({"L": 4000, "F1": 4000}, [("L", 0.5), ("F1", 0.5)]),
    ({"L": 1020, "F1": 3020}, [("L", 0.25), ("F1", 0.75)]),
    ({"L": 4000}, [("L", 1.0)]),
    ({"L": 320, "F1": 920}, [("L", 0.25), ("F1", 0.75)]),                 # by room after buffers
]


@pytest.mark.parametrize("offers, expected", TENSOR_CASES)
def test_tensor_split(offers, expected):
    placement = place(NEED, nodes(**offers), "L", "tensor")
    assert placement.split_mode == "tensor"
    assert [(s.node_id, s.share) for s in placement.shares] == expected
    assert sum(s.share for s in placement.shares) == pytest.approx(1.0)


def test_tensor_split_follows_measured_compute():
    offers = [NodeOffer("L", 4000 * MIB, compute=10.0), NodeOffer("F1", 4000 * MIB, compute=30.0)]
    placement = place(NEED, offers, "L", "tensor")
    assert [(s.node_id, s.share) for s in placement.shares] == [("L", 0.25), ("F1", 0.75)]
    assert "measured compute" in placement.describe()["reason"]
    unmeasured = [NodeOffer("L", 4000 * MIB, compute=10.0), NodeOffer("F1", 4000 * MIB)]
    assert "memory" in place(NEED, unmeasured, "L", "tensor").describe()["reason"]


def test_tensor_split_takes_one_node_per_kv_group_at_most():
    offers = [NodeOffer(i, 4000 * MIB, compute=c) for i, c in (("L", 1), ("F1", 5), ("F2", 9), ("F3", 7))]
    placement = place(NEED, offers, "L", "tensor")
    assert placement.node_ids == ["L", "F2", "F3"]                 # the leader, then the fastest
    with pytest.raises(PlacementError) as caught:
        place(NEED, offers, "L", "tensor", ["L", "F1", "F2", "F3"])
    assert caught.value.kind == "invalid" and caught.value.param == "options.nodes"


def test_tensor_split_needs_the_leader_and_known_kv_heads():
    with pytest.raises(PlacementError) as caught:
        place(NEED, nodes(L=4000, F1=4000), "L", "tensor", ["F1"])
    assert caught.value.param == "options.nodes" and "leader" in str(caught.value)
    unknown = Need(weights=240 * MIB, kv_cache=60 * MIB, buffers=20 * MIB, n_layer=30)
    with pytest.raises(PlacementError) as caught:
        place(unknown, nodes(L=4000, F1=4000), "L", "tensor")
    assert caught.value.param == "options.split_mode"


def test_tensor_split_refuses_a_shard_past_a_nodes_memory():
    offers = [NodeOffer("L", 4000 * MIB, compute=1.0), NodeOffer("F1", 100 * MIB, compute=9.0)]
    with pytest.raises(PlacementError) as caught:
        place(NEED, offers, "L", "tensor")
    assert caught.value.kind == "insufficient" and "F1" in str(caught.value)


def test_describe_has_the_spec_fields():
    layer = Placement("layer", (Share("L", 5 * MIB, layers=10), Share("F1", 9 * MIB, layers=20)))
    assert layer.describe() == {"split_mode": "layer", "nodes": [
        {"id": "L", "layers": 10, "memory_bytes": 5 * MIB}, {"id": "F1", "layers": 20, "memory_bytes": 9 * MIB}]}
    tensor = Placement("tensor", (Share("L", MIB, share=0.25), Share("F1", MIB, share=0.75)))
    assert tensor.describe()["nodes"][1] == {"id": "F1", "share": 0.75, "memory_bytes": MIB}



def test_lanes_are_for_a_layer_split_over_several_nodes():
    offers = nodes(L=319, F1=319)
    assert place(NEED, offers, "L", "layer", lanes=2, slots=16).describe()["lanes"] == 2
    assert "lanes" not in place(NEED, offers, "L", "layer", slots=16).describe()         # unmeasured: one
    assert place(NEED, nodes(L=4000), "L", "layer", lanes=2).lanes == 1                 # one node
    assert place(NEED, offers, "L", "tensor", lanes=2).lanes == 1                       # every node each step


ENGINE_CASES = [
    # (shares, expected remote nodes, tensor_split, n_gpu_layers)
    ([("L", 30)], [], [], 0),
    ([("L", 15), ("F1", 15)], ["F1"], [16.0], 16),
    ([("L", 10), ("F1", 10), ("F2", 10)], ["F1", "F2"], [10.0, 11.0], 21),
    ([("F1", 20), ("F2", 10)], ["F1", "F2"], [20.0, 11.0], 31),
]


@pytest.mark.parametrize("shares, remote, split, n_gpu_layers", ENGINE_CASES)
def test_engine_split_lands_each_layer_where_placed(shares, remote, split, n_gpu_layers):
    placement = Placement("layer", tuple(Share(n, 0, layers=k) for n, k in shares))
    assert engine_split(placement, "L", 30) == (remote, split, n_gpu_layers)
    if remote:
        # llama.cpp's rule: layer il >= n_layer + 1 - n_gpu_layers goes to the first device
        # whose cumulative share exceeds (il - start) / n_gpu_layers
        start = 31 - n_gpu_layers
        cumulative = [sum(split[:i + 1]) / sum(split) for i in range(len(split))]
        counts = [0] * len(split)
        for il in range(start, 30):
            counts[next(i for i, c in enumerate(cumulative) if c > (il - start) / n_gpu_layers)] += 1
        assert counts == [k for n, k in shares if n != "L"]


def test_pipeline_puts_the_leaders_layers_on_its_own_rpc_device_too():
    placement = place(NEED, nodes(L=319, F1=319), "L", "layer", pipeline=True)
    assert placement.pipeline and placement.describe()["pipeline"] is True
    assert engine_split(placement, "L", 30) == (["L", "F1"], [15.0, 16.0], 31)
    alone = place(NEED, nodes(L=4000, F1=4000), "L", "layer", pipeline=True)   # one node: no RPC
    assert not alone.pipeline and alone.is_local("L")


GIVEN_LAYER_CASES = [
    # (pinned, layers, expected layers per node in placement order)
    (["L", "F1"], [18, 12], [("L", 18), ("F1", 12)]),
    (["F1", "L"], [12, 18], [("L", 18), ("F1", 12)]),               # the leader goes first, its count with it
    (["L", "F1", "F2"], [10, 12, 8], [("L", 10), ("F1", 12), ("F2", 8)]),
    (["F2", "F1"], [1, 29], [("F2", 1), ("F1", 29)]),
    (["L"], [30], [("L", 30)]),
]


@pytest.mark.parametrize("pinned, layers, expected", GIVEN_LAYER_CASES)
def test_given_layer_counts_are_kept(pinned, layers, expected):
    placement = place(NEED, nodes(L=4000, F1=4000, F2=4000), "L", "layer", pinned, layers=layers)
    assert [(s.node_id, s.layers) for s in placement.shares] == expected
    assert all(s.memory_bytes == s.layers * 10 * MIB + 20 * MIB for s in placement.shares)


@pytest.mark.parametrize("split_mode, pinned, layers, says", [
    ("layer", None, [15, 15], "needs 'options.nodes'"),
    ("layer", ["L", "F1"], [30], "one count for each"),
    ("layer", ["L", "F1"], [15, 16], "add up to the model's 30 layers"),
    ("layer", ["L", "F1"], [0, 30], "at least 1"),
    ("tensor", ["L", "F1"], [15, 15], "is for the layer split"),
])
def test_given_layer_counts_that_cannot_be_honoured_are_refused(split_mode, pinned, layers, says):
    with pytest.raises(PlacementError) as refused:
        place(NEED, nodes(L=4000, F1=4000), "L", split_mode, pinned, layers=layers)
    assert refused.value.kind == "invalid" and "'options.layers'" in str(refused.value) and says in str(refused.value)


def test_given_layer_counts_past_a_nodes_memory_are_insufficient():
    with pytest.raises(PlacementError) as refused:       # 25 layers need 270 MiB; F1 offers 200
        place(NEED, nodes(L=4000, F1=200), "L", "layer", ["L", "F1"], layers=[5, 25])
    assert refused.value.kind == "insufficient" and "node F1" in str(refused.value)
