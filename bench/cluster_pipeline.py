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
pin = ""          # --pin: "", "all" or "compute"
stagger = False   # --stagger: the second engine at nice 19 on both nodes


def stat_cpu(path: str) -> int:
    """utime + stime, in clock ticks, of a /proc/.../stat file."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pids) -> float:
    """User + system CPU of these processes (all threads) so far."""
    return sum(stat_cpu(f"/proc/{pid}/stat") for pid in pids) / os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def pin_to(pid: int, cpus: set[int], warm: bool = False) -> None:
    """--pin all: every thread of the process (affinity is per thread; new ones inherit it).
    --pin compute: once `warm`, only its busiest thread (its compute thread)."""
    if pin == "all":
        for tid in threads(pid):
            os.sched_setaffinity(tid, cpus)
    elif pin == "compute" and warm:
        busiest = max(threads(pid), key=lambda tid: stat_cpu(f"/proc/{pid}/task/{tid}/stat"))
        os.sched_setaffinity(busiest, cpus)


async def measure(loop, params, rpcs=(None,), followers=()) -> tuple[float, float]:
    """(tokens/s with 16 clients shared by the engines, one per entry of `rpcs`; tokens/s with
    one client). `followers`: the RPC server children of the run, pinned to the follower's core."""
    runners = [await start_worker(loop, dict(params, n_slots=CLIENTS // len(rpcs)), rpc) for rpc in rpcs]
    leader_pids, follower_pids = [r.engine.pid for r in runners], [f.proc.pid for f in followers]
    for pid in leader_pids:
        pin_to(pid, LEADER_CPU)
    for pid in follower_pids:
        pin_to(pid, FOLLOWER_CPU)
    try:
        sampling = SamplingParams()
        sampling.temperature, sampling.ignore_eos = 0.0, True
        prompt = chat_prompt(runners[0].engine.vocab, "Tell me a story.")

        async def one(runner) -> int:
            stream = await runner.generate([(prompt, TOKENS, sampling)], [])
            return sum([event.n_tokens async for event in stream])

        await asyncio.gather(*(one(r) for r in runners))           # warm up
        for pids, cpus in ((leader_pids, LEADER_CPU), (follower_pids, FOLLOWER_CPU)):
            for pid in pids:
                pin_to(pid, cpus, warm=True)
        if stagger and len(runners) == 2:   # the second engine and its RPC server yield their cores
            for pid in (leader_pids[1], follower_pids[1]):
                for tid in threads(pid):
                    os.setpriority(os.PRIO_PROCESS, tid, 19)
        busy_before = cpu_seconds(leader_pids), cpu_seconds(follower_pids)
        start = time.monotonic()
        many = sum(await asyncio.gather(*(one(r) for r in runners for _ in range(CLIENTS // len(runners)))))
        wall = time.monotonic() - start
        if follower_pids:
            print(f"  {len(runners)} engine(s): leader's workers busy "
                  f"{(cpu_seconds(leader_pids) - busy_before[0]) / wall:.0%} of a core, follower's RPC "
                  f"servers {(cpu_seconds(follower_pids) - busy_before[1]) / wall:.0%}", flush=True)
        start = time.monotonic()
        single = await one(runners[0]) / (time.monotonic() - start)
        return many / wall, single
    finally:
        for runner in runners:
            await runner.close()


async def main(ubatches: list[int], two_engines: bool) -> None:
    loop = asyncio.get_running_loop()
    peers = Peers(loop, tempfile.mkdtemp(prefix="stackd-pipeline-"))
    try:
        rows = [("1 node", await measure(loop, engine_params()))]
        follower = await peers.start()
        rows.append(("layer, leader CPU", await measure(
            loop, engine_params(split_mode=1, tensor_split=[16.0], n_gpu_layers=16), [peers.rpc([follower])],
            [follower])))
        for ubatch in ubatches:
            own, follower = await peers.start(direct=True), await peers.start()
            pin_to(own.proc.pid, LEADER_CPU)
            rows.append((f"pipeline, ubatch {ubatch}", await measure(
                loop, engine_params(split_mode=1, tensor_split=[15.0, 16.0], n_gpu_layers=31, n_ubatch=ubatch),
                [peers.rpc([own, follower])], [follower])))
        if two_engines:
            followers = [await peers.start(), await peers.start()]
            rows.append(("two engines in flight", await measure(
                loop, engine_params(split_mode=1, tensor_split=[16.0], n_gpu_layers=16),
                [peers.rpc([f]) for f in followers], followers)))
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
