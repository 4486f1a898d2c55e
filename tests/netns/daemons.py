"""Daemons in network namespaces, for the cluster and placement tests: a fixture that makes
the namespaces (and removes them after the daemons are gone), and a node's settings inside one.
Each namespace has its own ports, so every node uses the defaults."""
from __future__ import annotations

import pytest

from . import topology
from .topology import Topology

CLUSTER_PORT, INFERENCE_PORT = 5381, 8080
RPC_PORT = 50052                                    # cluster.rpc_port's default

needs_namespaces = pytest.mark.skipif(topology.available() is not None, reason=topology.available() or "")


@pytest.fixture
def namespaces():
    topology.sweep()
    net = Topology()
    try:
        yield net
    finally:
        net.close()


def in_namespace(net_node: tuple[str, str], advertise: str, **kwargs) -> dict:
    """Node keyword arguments for a daemon in the namespace `net_node` (from add_node) that
    listens on every address there and tells the cluster `advertise` (its cluster link's)."""
    netns, reach = net_node
    return {"host": "0.0.0.0", "advertise": f"http://{advertise}:{CLUSTER_PORT}", "reach": reach,
            "netns": netns, "ports": (INFERENCE_PORT, CLUSTER_PORT), **kwargs}
