import pytest

from testing.cluster_nodes import Node


@pytest.fixture
def start_node(tmp_path):
    """start_node(name, **Node kwargs): every node started is killed at the end, pass or fail."""
    started: list[Node] = []

    def start(name: str, **kwargs) -> Node:
        node = Node(str(tmp_path / name), **kwargs)
        started.append(node)
        return node

    yield start
    for node in started:
        node.kill()
