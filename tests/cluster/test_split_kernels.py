"""Our kernels on every node of a layer split: the followers' ggml RPC servers serve our
kernels' served device (kernels/README.md, "Served over RPC"), so a split computes what one
node computes with engine.kernels = auto, and greedy texts are equal byte for byte.

Real engine workers, real SmolLM2 (30 layers), real RPC server children behind their relays on
loopback. Every SIMD path serves: a follower forced to AVX2 or to the scalar reference gives the
leader's (AVX-512 here) text too, since every path computes the same bits (kernels/README.md,
"The arithmetic")."""
from __future__ import annotations

import asyncio

import pytest

from stackd.engine import accel
from testing.rpc_workers import PROMPTS, Peers, engine_params, generate, start_worker

N_LAYER = 30


@pytest.fixture
def peers(loop, tmp_path):
    p = Peers(loop, str(tmp_path), kernels="auto")
    yield p
    p.servers.stop_all()


def run(loop, coro, timeout: float = 900):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


def layer_split(*follower_layers: int) -> dict:
    """The leader keeps the first layers; each follower a run of the next, the last one the output."""
    split = [float(k) for k in follower_layers]
    split[-1] += 1.0
    return dict(split_mode=1, tensor_split=split, n_gpu_layers=sum(follower_layers) + 1)


async def outputs(loop, params, rpc=None, prompts=PROMPTS, max_tokens=24):
    runner = await start_worker(loop, params, rpc, kernels="auto")
    try:
        return [await generate(runner, text, max_tokens=max_tokens) for text in prompts]
    finally:
        await runner.close()


def test_a_layer_split_with_our_kernels_on_every_node_gives_one_node_s_greedy_text(loop, peers):
    if not accel.cpu_supports("avx2"):
        pytest.skip("engine.kernels = auto needs AVX2")

    async def main():
        alone = await outputs(loop, engine_params())
        assert all(o["text"] and o["error"] is None for o in alone)
        one = await peers.start()
        assert await outputs(loop, engine_params(**layer_split(15)), peers.rpc([one])) == alone
        a, b = await peers.start(), await peers.start()
        assert await outputs(loop, engine_params(**layer_split(10, 10)), peers.rpc([a, b])) == alone
    run(loop, main())


@pytest.mark.parametrize("path", ["avx2", "scalar"])
def test_a_follower_on_another_simd_path_gives_the_same_text(loop, peers, path):
    """The follower takes the last 20 layers and the output (most of the arithmetic)."""
    if not accel.cpu_supports("avx2"):
        pytest.skip("engine.kernels = auto needs AVX2")

    async def main():
        prompts = PROMPTS[:2]
        alone = await outputs(loop, engine_params(), prompts=prompts, max_tokens=16)
        follower = await peers.start(kernels=path)
        split = await outputs(loop, engine_params(**layer_split(20)), peers.rpc([follower]), prompts=prompts,
                              max_tokens=16)
        assert split == alone
    run(loop, main())


def test_a_follower_with_kernels_off_serves_ggml_s_cpu(loop, tmp_path):
    """engine.kernels = off on both sides: ggml's arithmetic everywhere, equal texts too."""
    async def main():
        p = Peers(loop, str(tmp_path), kernels="off")
        try:
            runner = await start_worker(loop, engine_params(), kernels="off")
            try:
                alone = await generate(runner, PROMPTS[0])
            finally:
                await runner.close()
            one = await p.start()
            runner = await start_worker(loop, engine_params(**layer_split(15)), p.rpc([one]), kernels="off")
            try:
                assert await generate(runner, PROMPTS[0]) == alone
            finally:
                await runner.close()
        finally:
            p.servers.stop_all()
    run(loop, main())


def test_a_q4_k_m_split_with_a_follower_on_avx2_gives_one_node_s_text(loop, peers):
    """The served device repacks Q4_K and Q6_K weights in place too (the same bytes as ggml's
    blocks): a Q4_K_M file (testing.quantized_model) split over two nodes, the follower
    forced to AVX2 with the last 20 layers, gives the leader's text alone."""
    if not accel.cpu_supports("avx2"):
        pytest.skip("engine.kernels = auto needs AVX2")
    from testing import quantized_model
    model = quantized_model.q4_k_m()

    async def main():
        prompts = PROMPTS[:2]
        alone = await outputs(loop, engine_params(model_path=model), prompts=prompts, max_tokens=16)
        assert all(o["text"] and o["error"] is None for o in alone)
        follower = await peers.start(kernels="avx2")
        split = await outputs(loop, engine_params(model_path=model, **layer_split(20)), peers.rpc([follower]),
                              prompts=prompts, max_tokens=16)
        assert split == alone
    run(loop, main())
