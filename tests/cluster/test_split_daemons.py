"""Greedy answers through real daemons with the default kernels (engine.kernels = auto): one
node alone, a layer split over two nodes and over three give the same text, byte for byte.
The followers' RPC server children serve our kernels (kernels/README.md, "Served over RPC");
before they did, their layers ran on ggml's arithmetic and a split changed the answers.

Once on loopback (the leader on 127.0.0.1, followers on 127.0.0.2 and .3) and once with every
node in a network namespace of its own on a veth link to the leader (the netns marker; root)."""
from __future__ import annotations

import pytest

from stackd.engine import accel
from testing.cluster_nodes import eventually, statuses
from testing.netns import CLUSTER_PORT, in_namespace
from testing.two_daemons import MODEL, daemons, node_env
from testing.daemon import free_port

# Prompts whose greedy texts part when the follower's layers run on ggml's kernels.
PROMPTS = ["Write a haiku about the sea.", "Count from one to ten.", "What is the capital of France?"]
MAX_TOKENS = 40
OFFER_MB = 600                   # each node could hold the model: the tests pin the placements
KERNELS = {"STACKD_ENGINE_KERNELS": "auto"}


def answers(leader) -> list[str]:
    out = []
    for text in PROMPTS:
        status, _, body = leader.request("POST", "/v1/chat/completions", port="inference", body={
            "model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": MAX_TOKENS})
        assert status == 200, body
        out.append(body["choices"][0]["message"]["content"])
    return out


def placed(leader, nodes: list[str]) -> list[str]:
    status, _, body = leader.request("POST", "/v1/models/load", body={"model": MODEL, "options": {"nodes": nodes}})
    assert status == 200, body
    assert [n["id"] for n in body["placement"]["nodes"]] == nodes
    assert all(n["layers"] > 0 for n in body["placement"]["nodes"])
    texts = answers(leader)
    status, _, body = leader.request("POST", "/v1/models/unload", body={"model": MODEL})
    assert status == 200, body
    return texts


def check_one_two_and_three_nodes_agree(leader, followers) -> None:
    for follower in followers:
        eventually(lambda f=follower: statuses(leader).get(f.node_id) == "up")
    ids = [leader.node_id] + [f.node_id for f in followers]
    alone = placed(leader, ids[:1])
    assert all(alone)
    assert placed(leader, ids[:2]) == alone
    assert placed(leader, ids) == alone


@pytest.fixture
def start_node(tmp_path):
    if not accel.cpu_supports("avx2"):
        pytest.skip("engine.kernels = auto needs AVX2")
    with daemons(tmp_path) as start:
        yield start


def test_a_layer_split_over_daemons_on_loopback_answers_as_one_node(start_node):
    leader = start_node("leader", env={**node_env(OFFER_MB, free_port()), **KERNELS})
    followers = [start_node(f"follower{n}", role="follower", leader=leader.cluster_url, host=host, reach=host,
                            env={**node_env(OFFER_MB, free_port(host)), **KERNELS})
                 for n, host in enumerate(["127.0.0.2", "127.0.0.3"])]
    check_one_two_and_three_nodes_agree(leader, followers)


@pytest.mark.netns
def test_a_layer_split_over_namespaces_answers_as_one_node(namespaces, start_node):
    leader_ns = namespaces.add_node("leader")
    links = []
    for n in range(2):
        follower_ns = namespaces.add_node(f"follower{n}")
        links.append((follower_ns, *namespaces.connect(leader_ns[0], follower_ns[0])))
    leader = start_node("leader", **in_namespace(leader_ns, links[0][1], env={**node_env(OFFER_MB), **KERNELS}))
    followers = [start_node(f"follower{n}", **in_namespace(
        follower_ns, follower_ip, role="follower", leader=f"http://{leader_ip}:{CLUSTER_PORT}",
        env={**node_env(OFFER_MB), **KERNELS})) for n, (follower_ns, leader_ip, follower_ip) in enumerate(links)]
    check_one_two_and_three_nodes_agree(leader, followers)
