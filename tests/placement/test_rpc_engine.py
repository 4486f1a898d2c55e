"""The engine over real ggml RPC servers on loopback (SmolLM2, 30 layers): a layer split gives
the same greedy output as one node. (A tensor split runs no RPC: tests/cluster/test_tensor_split.py.)"""
from __future__ import annotations

import pytest

from stackd.cluster.placement import NodeOffer, Need, engine_split, place

from .conftest import PROMPTS, engine_params, generate, run, start_worker

pytestmark = pytest.mark.slow

N_LAYER = 30


def split_params(node_ids, layers_by_node, leader="leader"):
    offers = [NodeOffer(i, 1 << 40) for i in node_ids]
    need = Need(weights=N_LAYER, kv_cache=0, buffers=0, n_layer=N_LAYER)
    placement = place(need, offers, leader, pinned=node_ids)
    assert [s.layers for s in placement.shares] == layers_by_node
    remote, split, n_gpu_layers = engine_split(placement, leader, N_LAYER)
    return remote, dict(split_mode=1, tensor_split=split, n_gpu_layers=n_gpu_layers)


async def outputs(loop, params, rpc=None, n_top=0):
    runner = await start_worker(loop, params, rpc)
    try:
        return [await generate(runner, text, n_top=n_top) for text in PROMPTS]
    finally:
        await runner.close()


def test_layer_split_over_two_and_three_nodes_equals_one_node(loop, peers):
    async def main():
        alone = await outputs(loop, engine_params())
        assert all(o["text"] and o["error"] is None for o in alone)
        one = await peers.start()
        remote, split = split_params(["leader", "f1"], [15, 15])
        two = await outputs(loop, engine_params(**split), peers.rpc([one]))
        assert two == alone
        one2, other = await peers.start(), await peers.start()
        remote, split = split_params(["leader", "f1", "f2"], [10, 10, 10])
        three = await outputs(loop, engine_params(**split), peers.rpc([one2, other]))
        assert three == alone
    run(loop, main())


def test_every_layer_on_followers_equals_one_node(loop, peers):
    """A pinned placement without the leader: all layers and the output on RPC devices."""
    async def main():
        alone = await outputs(loop, engine_params())
        a, b = await peers.start(), await peers.start()
        remote, split = split_params(["f1", "f2"], [15, 15])
        assert split["n_gpu_layers"] == N_LAYER + 1
        assert await outputs(loop, engine_params(**split), peers.rpc([a, b])) == alone
    run(loop, main())


def test_pipelined_layer_split_equals_one_node(loop, peers):
    """The leader's layers on its own loopback RPC server too (every layer on an RPC device:
    llama.cpp's pipeline parallelism), in micro-batches of 2."""
    async def main():
        alone = await outputs(loop, engine_params())
        own, follower = await peers.start(direct=True), await peers.start()
        split = dict(split_mode=1, tensor_split=[15.0, 16.0], n_gpu_layers=N_LAYER + 1, n_ubatch=2)
        assert await outputs(loop, engine_params(**split), peers.rpc([own, follower])) == alone
    run(loop, main())
