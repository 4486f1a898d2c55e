"""Daemons in network namespaces, for the cluster and placement tests: a fixture that makes
the namespaces (and removes them after the daemons are gone); a node's settings inside one are
stackd.testing.netns.in_namespace."""
from __future__ import annotations

import pytest

from stackd.testing import netns as topology
from stackd.testing.netns import CLUSTER_PORT, INFERENCE_PORT, RPC_PORT, Topology, in_namespace

__all__ = ["CLUSTER_PORT", "INFERENCE_PORT", "RPC_PORT", "in_namespace", "namespaces", "needs_namespaces"]

needs_namespaces = pytest.mark.skipif(topology.available() is not None, reason=topology.available() or "")


@pytest.fixture
def namespaces():
    topology.sweep()
    net = Topology()
    try:
        yield net
    finally:
        net.close()
