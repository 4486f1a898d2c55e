"""Can two nodes decode faster than one by overlapping their work (pipeline parallelism)?
Engine level, no HTTP: 16 concurrent greedy requests of 64 tokens on SmolLM2 (30 layers), one
thread per node, the follower's RPC server behind its relay on loopback:

  1 node                 every layer on the worker's CPU
  layer, 1 lane          the first layers on the worker's CPU, the rest (and the output layer)
                         on a follower's RPC server: each step runs on one node, then the other
  layer, 2 lanes         the same, with the engine's two lanes (native/engine/engine.h), what a
                         two-node layer split gets: two contexts of 8 slots, so while one lane's
                         step is on the follower, the other's runs on the leader
  pipeline, ubatch N     every layer on an RPC device (the leader's own on loopback, 15 + 15):
                         llama.cpp's pipeline parallelism is on; a decode step of 16 tokens is
                         cut into micro-batches of N, so device 1 can work on one while device 0
                         works on the next (--ubatch, none by default)

    .venv/bin/python bench/cluster_pipeline.py [--rounds 3] [--pin] [--follower-layers 11]
                                               [--lanes 2,3] [--ubatch 16,8,4] [--kernels off|auto]

--pin gives each node a core of its own (two or more cores): the leader's worker runs on CPU
0 and the follower's RPC server on CPU 1, so "one thread per node" holds however the
processes are scheduled. --follower-layers: the follower's layers (it also computes the output
layer, 28 M weights, ~7 layers' worth: 11 balances the two halves). --rounds: each round runs
every row once, alternating, and the table shows each row's median (this machine's figures
move by tens of percent from one run to the next).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import statistics
import tempfile
import time

import uvloop

from stackd.engine.core import SamplingParams
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing.processes import cpu_seconds, cpu_ticks, threads  # noqa: E402
from testing.rpc_workers import Peers, chat_prompt, engine_params, start_worker  # noqa: E402

CLIENTS, TOKENS = 16, 64
LEADER_CPU, FOLLOWER_CPU = {0}, {1}
pin = ""          # --pin: "", "all" or "compute"
kernels = "off"   # --kernels: every node's, the leader's worker and the followers' RPC servers


def pin_to(pid: int, cpus: set[int], warm: bool = False, n_compute: int = 1) -> None:
    """--pin all: every thread of the process (affinity is per thread; new ones inherit it).
    --pin compute: once `warm`, only its `n_compute` busiest threads (its compute threads: one
    per lane in a worker)."""
    if pin == "all":
        for tid in threads(pid):
            os.sched_setaffinity(tid, cpus)
    elif pin == "compute" and warm:
        by_cpu = sorted(threads(pid), key=lambda tid: cpu_ticks(f"/proc/{pid}/task/{tid}/stat"), reverse=True)
        for tid in by_cpu[:n_compute]:
            os.sched_setaffinity(tid, cpus)



async def in_rounds(rows, rounds: int) -> dict:
    """{row name: [(tok/s at CLIENTS, tok/s at 1), one per round]}: every row once per round, in
    turn, so that a drift of the machine touches every row alike."""
    results = {name: [] for name, _ in rows}
    for r in range(rounds):
        for name, run in rows:
            print(f"round {r + 1}, {name}:", flush=True)
            results[name].append(await run())
    return results


def medians(figures: list) -> tuple[float, float]:
    return tuple(statistics.median(x[k] for x in figures) for k in (0, 1))

async def measure(loop, params, rpcs=(None,), followers=()) -> tuple[float, float]:
    """(tokens/s with 16 clients shared by the engines, one per entry of `rpcs`; tokens/s with
    one client). `followers`: the RPC server children of the run, pinned to the follower's core."""
    runners = [await start_worker(loop, dict(params, slots=CLIENTS // len(rpcs)), rpc, kernels=kernels)
               for rpc in rpcs]
    leader_pids, follower_pids = [r.engine.pid for r in runners], [f.proc.pid for f in followers]
    for pid in leader_pids:
        pin_to(pid, LEADER_CPU)
    for pid in follower_pids:
        pin_to(pid, FOLLOWER_CPU)
    try:
        sampling = SamplingParams()
        sampling.temperature, sampling.ignore_eos = 0.0, True
        prompt = await chat_prompt(runners[0], "Tell me a story.")

        async def one(runner) -> int:
            stream = await runner.generate([(prompt, TOKENS, sampling)], [])
            return sum([event.n_tokens async for event in stream])

        await asyncio.gather(*(one(r) for r in runners for _ in range(2)))   # warm up (both lanes)
        for pid in leader_pids:
            pin_to(pid, LEADER_CPU, warm=True, n_compute=params.get("n_lanes", 1))
        for pid in follower_pids:
            pin_to(pid, FOLLOWER_CPU, warm=True)
        busy_before = cpu_seconds(leader_pids), cpu_seconds(follower_pids)
        start = time.monotonic()
        many = sum(await asyncio.gather(*(one(r) for r in runners for _ in range(CLIENTS // len(runners)))))
        wall = time.monotonic() - start
        if follower_pids:
            print(f"  leader's worker busy {(cpu_seconds(leader_pids) - busy_before[0]) / wall:.0%} of a core, "
                  f"follower's RPC server {(cpu_seconds(follower_pids) - busy_before[1]) / wall:.0%}", flush=True)
        start = time.monotonic()
        single = await one(runners[0]) / (time.monotonic() - start)
        return many / wall, single
    finally:
        for runner in runners:
            await runner.close()


async def main(rounds: int, follower_layers: int, ubatches: list[int], lanes: list[int]) -> None:
    loop = asyncio.get_running_loop()
    peers = Peers(loop, tempfile.mkdtemp(prefix="stackd-pipeline-"), kernels=kernels)
    split = dict(split_mode=1, tensor_split=[float(follower_layers + 1)], n_gpu_layers=follower_layers + 1)

    async def one_node():
        return await measure(loop, engine_params())

    def layer_split(lanes: int):
        async def run():
            follower = await peers.start()
            try:
                return await measure(loop, engine_params(**split, n_lanes=lanes), [peers.rpc([follower])], [follower])
            finally:
                await peers.servers.stop(follower.placement_id)
        return run

    def pipelined(ubatch: int):
        async def run():
            own, follower = await peers.start(direct=True), await peers.start()
            pin_to(own.proc.pid, LEADER_CPU)
            try:
                return await measure(loop, engine_params(split_mode=1, tensor_split=[15.0, 16.0], n_gpu_layers=31,
                                                         n_ubatch=ubatch), [peers.rpc([own, follower])], [follower])
            finally:
                await peers.servers.stop(own.placement_id)
                await peers.servers.stop(follower.placement_id)
        return run

    rows = [("1 node", one_node), ("layer, 1 lane", layer_split(1))]
    rows += [(f"layer, {n} lanes", layer_split(n)) for n in lanes]
    rows += [(f"pipeline, ubatch {u}", pipelined(u)) for u in ubatches]
    try:
        results = await in_rounds(rows, rounds)
        base = medians(results["1 node"])
        print(f"medians of {rounds} round(s), follower {follower_layers} layers + output, kernels {kernels}, "
              f"pin {pin or 'no'}:")
        for name, _ in rows:
            many, single = medians(results[name])
            each = " ".join(f"{x[0]:.0f}" for x in results[name])
            print(f"  {name:20s} c={CLIENTS}: {many:6.1f} tok/s ({many / base[0]:.2f}x) [{each}]   "
                  f"c=1: {single:6.1f} tok/s ({single / base[1]:.2f}x)", flush=True)
    finally:
        peers.servers.stop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--follower-layers", type=int, default=15)
    parser.add_argument("--ubatch", default="")
    parser.add_argument("--lanes", default="2", help="lane counts to try beside one lane (2: what a 2-node split gets)")
    parser.add_argument("--kernels", default="off", choices=["off", "auto"])
    parser.add_argument("--pin", nargs="?", const="all", default="", choices=["all", "compute"],
                        help="leader's processes on CPU 0, follower's on CPU 1 (compute: their busiest threads only)")
    args = parser.parse_args()
    pin, kernels = args.pin, args.kernels
    uvloop.run(main(args.rounds, args.follower_layers, [int(u) for u in args.ubatch.split(",") if u],
                    [int(n) for n in args.lanes.split(",") if n]))
