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
