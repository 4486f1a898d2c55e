"""Can two nodes decode faster than one by overlapping micro-batches (pipeline parallelism)?
Engine level, no HTTP: 16 concurrent greedy requests of 64 tokens on SmolLM2 (30 layers), one
thread per node, RPC servers on loopback:

  1 node                 every layer on the worker's CPU
  layer, leader CPU      15 layers on the worker's CPU, 15 on a follower's RPC server
  pipeline, ubatch N     every layer on an RPC device (the leader's own on loopback, 15 + 15):
                         llama.cpp's pipeline parallelism is on; a decode step of 16 tokens is
                         cut into micro-batches of N, so device 1 can work on one while device 0
                         works on the next

    .venv/bin/python bench/cluster_pipeline.py [--ubatch 16,8,4]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import uvloop  # noqa: E402

from server.engine.native import SamplingParams  # noqa: E402
from tests.placement.conftest import Peers, chat_prompt, engine_params, start_worker  # noqa: E402

CLIENTS, TOKENS = 16, 64


async def measure(loop, params, rpc=None) -> tuple[float, float]:
    """(tokens/s with 16 clients, tokens/s with one)."""
    runner = await start_worker(loop, dict(params, n_slots=CLIENTS), rpc)
    try:
        sampling = SamplingParams()
        sampling.temperature, sampling.ignore_eos = 0.0, True
        prompt = chat_prompt(runner.engine.vocab, "Tell me a story.")

        async def one() -> int:
            stream = await runner.generate([(prompt, TOKENS, sampling)], [])
            return sum([event.n_tokens async for event in stream])

        await one()                                     # warm up
        start = time.monotonic()
        many = sum(await asyncio.gather(*(one() for _ in range(CLIENTS)))) / (time.monotonic() - start)
        start = time.monotonic()
        single = await one() / (time.monotonic() - start)
        return many, single
    finally:
        await runner.close()


async def main(ubatches: list[int]) -> None:
    loop = asyncio.get_running_loop()
    peers = Peers(loop, tempfile.mkdtemp(prefix="stackd-pipeline-"))
    try:
        rows = [("1 node", await measure(loop, engine_params()))]
        follower = await peers.start()
        rows.append(("layer, leader CPU", await measure(
            loop, engine_params(split_mode=1, tensor_split=[16.0], n_gpu_layers=16), peers.rpc([follower]))))
        for ubatch in ubatches:
            own, follower = await peers.start(direct=True), await peers.start()
            rows.append((f"pipeline, ubatch {ubatch}", await measure(
                loop, engine_params(split_mode=1, tensor_split=[15.0, 16.0], n_gpu_layers=31, n_ubatch=ubatch),
                peers.rpc([own, follower]))))
        base = rows[0][1]
        for name, (many, single) in rows:
            print(f"  {name:22s} c={CLIENTS}: {many:6.1f} tok/s ({many / base[0]:.2f}x)   "
                  f"c=1: {single:6.1f} tok/s ({single / base[1]:.2f}x)", flush=True)
    finally:
        peers.servers.stop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ubatch", default="16,8,4")
    uvloop.run(main([int(u) for u in parser.parse_args().ubatch.split(",")]))
