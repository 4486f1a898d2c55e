"""Can two nodes decode faster than one by overlapping micro-batches (pipeline parallelism)?
Engine level, no HTTP: 16 concurrent greedy requests of 64 tokens on SmolLM2 (30 layers), one
thread per node, RPC servers on loopback:

  1 node                 every layer on the worker's CPU
  layer, leader CPU      15 layers on the worker's CPU, 15 on a follower's RPC server
  pipeline, ubatch N     every layer on an RPC device (the leader's own on loopback, 15 + 15):
                         llama.cpp's pipeline parallelism is on; a decode step of 16 tokens is
                         cut into micro-batches of N, so device 1 can work on one while device 0
                         works on the next
  two engines in flight  two workers of 8 slots each, each with its 15 layers on the leader's
                         CPU and 15 on an RPC server of its own on the follower: while one
                         engine's step is on the follower, the other's can be on the leader
                         (the overlap issue 9 asks the engine for, tried with two processes)

    .venv/bin/python bench/cluster_pipeline.py [--ubatch 16,8,4] [--two-engines] [--pin [compute]] [--stagger]

--pin gives each node a core of its own (two or more cores): the leader's worker processes
run on CPU 0 and the follower's RPC servers on CPU 1, so "one thread per node" holds however
the processes are scheduled. --pin compute pins only each process's busiest thread (its
compute thread, found after the warm-up) and leaves the relay and dialer threads, which carry
the RPC bytes, free to run on either core, as they would on a device with more than one.
--stagger puts the second engine (its worker and its RPC server) at nice 19: left alone, the
two engines' steps fall into step with each other (both on the leader, then both on the
follower), and nothing overlaps.
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
LEADER_CPU, FOLLOWER_CPU = {0}, {1}
pin = ""          # "", "all" or "compute"
warm = False      # set once a warm-up ran (--pin compute needs the threads' CPU so far)
pinned_followers: list = []
stagger = False   # --stagger: the second engine at nice 19 on both nodes


def thread_cpu(pid: int, tid: str) -> int:
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def pin_to(pid: int, cpus: set[int]) -> None:
    """Every thread of the process (affinity is per thread; new ones inherit it), or with
    --pin compute, once warm, its busiest thread only."""
    if pin == "all":
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), cpus)
    elif pin == "compute" and warm:
        tids = os.listdir(f"/proc/{pid}/task")
        os.sched_setaffinity(int(max(tids, key=lambda tid: thread_cpu(pid, tid))), cpus)


def cpu_seconds(pids) -> float:
    """User + system CPU of these processes (all threads) so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def pin_followers(children) -> None:
    pinned_followers[:] = children
    for child in children:
        pin_to(child.proc.pid, FOLLOWER_CPU)


def pin_warm(leader_pids) -> None:
    """After a warm-up: --pin compute can tell the compute threads now."""
    global warm
    warm = True
    for pid in leader_pids:
        pin_to(pid, LEADER_CPU)
    for child in pinned_followers:
        pin_to(child.proc.pid, FOLLOWER_CPU)
    warm = False


async def measure(loop, params, rpc=None) -> tuple[float, float]:
    """(tokens/s with 16 clients, tokens/s with one)."""
    runner = await start_worker(loop, dict(params, n_slots=CLIENTS), rpc)
    pin_to(runner.engine.pid, LEADER_CPU)
    try:
        sampling = SamplingParams()
        sampling.temperature, sampling.ignore_eos = 0.0, True
        prompt = chat_prompt(runner.engine.vocab, "Tell me a story.")

        async def one() -> int:
            stream = await runner.generate([(prompt, TOKENS, sampling)], [])
            return sum([event.n_tokens async for event in stream])

        await one()                                     # warm up
        pin_warm([runner.engine.pid])
        start = time.monotonic()
        many = sum(await asyncio.gather(*(one() for _ in range(CLIENTS)))) / (time.monotonic() - start)
        start = time.monotonic()
        single = await one() / (time.monotonic() - start)
        return many, single
    finally:
        await runner.close()


async def measure_two(loop, params, rpcs, follower_pids=()) -> tuple[float, float]:
    """(tokens/s with 8 clients on each of two engines at once, tokens/s with one client)."""
    runners = [await start_worker(loop, dict(params, n_slots=CLIENTS // 2), rpc) for rpc in rpcs]
    for runner in runners:
        pin_to(runner.engine.pid, LEADER_CPU)
    try:
        sampling = SamplingParams()
        sampling.temperature, sampling.ignore_eos = 0.0, True
        prompt = chat_prompt(runners[0].engine.vocab, "Tell me a story.")

        async def one(runner) -> int:
            stream = await runner.generate([(prompt, TOKENS, sampling)], [])
            return sum([event.n_tokens async for event in stream])

        await asyncio.gather(*(one(r) for r in runners))           # warm up
        leader_pids = [r.engine.pid for r in runners]
        pin_warm(leader_pids)
        if stagger:   # the second engine (and its RPC server) yields its core to the first
            for pid in (leader_pids[1], follower_pids[1]):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    os.setpriority(os.PRIO_PROCESS, int(tid), 19)
        cpu0 = cpu_seconds(leader_pids), cpu_seconds(follower_pids)
        start = time.monotonic()
        many = sum(await asyncio.gather(*(one(r) for r in runners for _ in range(CLIENTS // 2))))
        wall = time.monotonic() - start
        many /= wall
        print(f"  two engines: leader's workers busy {(cpu_seconds(leader_pids) - cpu0[0]) / wall:.0%} of a core, "
              f"follower's RPC servers {(cpu_seconds(follower_pids) - cpu0[1]) / wall:.0%}", flush=True)
        start = time.monotonic()
        single = await one(runners[0]) / (time.monotonic() - start)
        return many, single
    finally:
        for runner in runners:
            await runner.close()


async def main(ubatches: list[int], two_engines: bool) -> None:
    loop = asyncio.get_running_loop()
    peers = Peers(loop, tempfile.mkdtemp(prefix="stackd-pipeline-"))
    try:
        pinned_followers.clear()
        rows = [("1 node", await measure(loop, engine_params()))]
        follower = await peers.start()
        pin_followers([follower])
        rows.append(("layer, leader CPU", await measure(
            loop, engine_params(split_mode=1, tensor_split=[16.0], n_gpu_layers=16), peers.rpc([follower]))))
        for ubatch in ubatches:
            own, follower = await peers.start(direct=True), await peers.start()
            pin_to(own.proc.pid, LEADER_CPU)
            pin_followers([follower])
            rows.append((f"pipeline, ubatch {ubatch}", await measure(
                loop, engine_params(split_mode=1, tensor_split=[15.0, 16.0], n_gpu_layers=31, n_ubatch=ubatch),
                peers.rpc([own, follower]))))
        if two_engines:
            followers = [await peers.start(), await peers.start()]
            pin_followers(followers)
            rows.append(("two engines in flight", await measure_two(
                loop, engine_params(split_mode=1, tensor_split=[16.0], n_gpu_layers=16),
                [peers.rpc([f]) for f in followers], [f.proc.pid for f in followers])))
        base = rows[0][1]
        for name, (many, single) in rows:
            print(f"  {name:22s} c={CLIENTS}: {many:6.1f} tok/s ({many / base[0]:.2f}x)   "
                  f"c=1: {single:6.1f} tok/s ({single / base[1]:.2f}x)", flush=True)
    finally:
        peers.servers.stop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ubatch", default="16,8,4")
    parser.add_argument("--two-engines", action="store_true", help="also two workers of 8 slots in flight")
    parser.add_argument("--pin", nargs="?", const="all", default="", choices=["all", "compute"],
                        help="leader's processes on CPU 0, follower's on CPU 1 (compute: their busiest threads only)")
    parser.add_argument("--stagger", action="store_true",
                        help="two engines: the second at nice 19 on both nodes, so their steps alternate")
    args = parser.parse_args()
    pin, stagger = args.pin, args.stagger
    uvloop.run(main([int(u) for u in args.ubatch.split(",") if u], args.two_engines))
