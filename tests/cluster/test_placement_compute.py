"""A layer split's default counts follow each node's measured compute (the last node also
computes the output layer), memory still bounding every node; without measurements they follow
memory as before; `layers` still overrides."""
from __future__ import annotations

import pytest

from stackd.cluster.placement import Need, NodeOffer, PlacementError, place

MIB = 1 << 20
# SmolLM2-like: 30 layers of ~3 MiB; the tied Q8_0 output (30 MiB) about 8 layers' worth.
NEED = Need(weights=90 * MIB, kv_cache=0, buffers=10 * MIB, n_layer=30, output_layers=8.0)


def counts(nodes, **kw):
    return [(s.node_id, s.layers) for s in place(NEED, nodes, "a", pinned=[n.id for n in nodes], **kw).shares]


def test_equal_nodes_give_the_last_fewer_layers_for_the_output():
    nodes = [NodeOffer("a", 1000 * MIB, compute=1.0), NodeOffer("b", 1000 * MIB, compute=1.0)]
    assert counts(nodes) == [("a", 19), ("b", 11)]          # (30 + 8) / 2 = 19: 19 and 19 - 8


def test_a_slower_follower_takes_fewer_layers():
    nodes = [NodeOffer("a", 1000 * MIB, compute=2.0), NodeOffer("b", 1000 * MIB, compute=1.0),
             NodeOffer("c", 1000 * MIB, compute=1.0)]
    a, b, c = (k for _, k in counts(nodes))
    assert a + b + c == 30 and a > b > c                      # T = 38 / 4: 19, 9.5, 1.5


def test_memory_still_bounds_a_fast_node():
    nodes = [NodeOffer("a", 10 * MIB + 10 * 3 * MIB, compute=10.0), NodeOffer("b", 1000 * MIB, compute=1.0)]
    assert counts(nodes) == [("a", 10), ("b", 20)]


def test_without_measurements_memory_decides():
    nodes = [NodeOffer("a", 300 * MIB), NodeOffer("b", 100 * MIB, compute=1.0)]
    layers = dict(counts(nodes))
    assert layers["a"] > layers["b"]
    assert sum(layers.values()) == 30


def test_given_layers_override_compute():
    nodes = [NodeOffer("a", 1000 * MIB, compute=1.0), NodeOffer("b", 1000 * MIB, compute=1.0)]
    assert counts(nodes, layers=[15, 15]) == [("a", 15), ("b", 15)]
    with pytest.raises(PlacementError):
        counts(nodes, layers=[30, 0])


# ---- lanes: one per node when the counts follow measured compute -------------------------------

def lanes(nodes, slots, **kw):
    return place(NEED, nodes, "a", pinned=[n.id for n in nodes], slots=slots, **kw).lanes


def test_a_split_balanced_by_compute_gets_a_lane_per_node():
    two = [NodeOffer("a", 1000 * MIB, compute=2.0), NodeOffer("b", 1000 * MIB, compute=1.0)]
    assert lanes(two, slots=16) == 2
    assert lanes(two + [NodeOffer("c", 1000 * MIB, compute=1.0)], slots=16) == 3


def test_too_few_slots_keep_one_lane():
    two = [NodeOffer("a", 1000 * MIB, compute=1.0), NodeOffer("b", 1000 * MIB, compute=1.0)]
    assert lanes(two, slots=4) == 2                      # the edge: two slots a lane
    assert lanes(two, slots=3) == 1
    assert lanes(two, slots=1) == 1


def test_an_unmeasured_node_keeps_one_lane():
    nodes = [NodeOffer("a", 1000 * MIB, compute=1.0), NodeOffer("b", 1000 * MIB)]
    assert lanes(nodes, slots=16) == 1


def test_given_layers_keep_one_lane_unless_asked():
    two = [NodeOffer("a", 1000 * MIB, compute=1.0), NodeOffer("b", 1000 * MIB, compute=1.0)]
    assert lanes(two, slots=16, layers=[15, 15]) == 1
    assert lanes(two, slots=16, layers=[15, 15], lanes=4) == 4


def test_asked_lanes_override_the_default_within_the_slots():
    two = [NodeOffer("a", 1000 * MIB, compute=1.0), NodeOffer("b", 1000 * MIB, compute=1.0)]
    assert lanes(two, slots=16, lanes=1) == 1
    assert lanes(two, slots=16, lanes=3) == 3
    assert lanes(two, slots=2, lanes=3) == 2             # a lane needs a slot


def test_one_node_has_no_lanes():
    nodes = [NodeOffer("a", 1000 * MIB, compute=1.0), NodeOffer("b", 1000 * MIB, compute=1.0)]
    placement = place(NEED, nodes, "a", slots=16)        # fits the leader alone
    assert len(placement.shares) == 1 and placement.lanes == 1


def test_pinned_nodes_each_take_a_layer_even_when_compute_would_leave_one_none():
    slow_last = [NodeOffer("a", 1000 * MIB, compute=4.0), NodeOffer("b", 1000 * MIB, compute=4.0),
                 NodeOffer("c", 1000 * MIB, compute=1.0)]             # c's share: 38/9 - 8 < 0
    assert counts(slow_last) == [("a", 15), ("b", 14), ("c", 1)]
