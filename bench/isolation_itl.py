"""Single-client inter-token latency, engine worker against inline, in alternating rounds.

A ratio of two ITL medians taken minutes apart moves by more than the 3 % it is meant to
judge (this machine gave 0.98x to 1.26x for the same build): the CPU's frequency and whatever
else runs drift between the two runs. Here both daemons are up at once (the one not measured is
idle) and short rounds alternate, worker, inline, inline, worker, ... (ABBA, so a drift within a
pair does not favour one side); each pair gives a ratio, and the median of the pairs' ratios is
the figure.

    .venv/bin/python bench/isolation_itl.py [--pairs 8] [--seconds 6] [--threads 2]

Same request as bench/inference.py (128 greedy tokens, end-of-generation suppressed), 16 slots
of 512 tokens, the chat model only. Target (engine-worker issue): worker <= 1.03x inline.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import loadgen  # noqa: E402
from inference import body, start_stackd  # noqa: E402


def itl_p50(server, seconds: float) -> float:
    result = asyncio.run(loadgen.run(server.port, body(server.model, 128), 1, seconds, server.key))
    return result.itl(0.5) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    servers = {}
    try:
        for mode in ("worker", "inline"):
            servers[mode] = start_stackd(16, 512, args.threads, mode)
            itl_p50(servers[mode], 2.0)                                  # warm up
        ratios = []
        print(f"{'pair':>4s} {'worker ms':>10s} {'inline ms':>10s} {'ratio':>7s}")
        for pair in range(args.pairs):
            order = ("worker", "inline") if pair % 2 == 0 else ("inline", "worker")
            got = {mode: itl_p50(servers[mode], args.seconds) for mode in order}
            ratios.append(got["worker"] / got["inline"])
            print(f"{pair + 1:4d} {got['worker']:10.2f} {got['inline']:10.2f} {ratios[-1]:7.3f}", flush=True)
        ratios = [r for r in ratios if r == r]          # a round with no whole request gives nan
        if not ratios:
            sys.exit("no round finished a request: the machine is too busy to measure")
        print(f"\nsingle-client ITL p50, worker / inline: median of {len(ratios)} pairs "
              f"{statistics.median(ratios):.3f}x (range {min(ratios):.3f}-{max(ratios):.3f}; target <= 1.03x)")
    finally:
        for server in servers.values():
            server.stop()
            shutil.rmtree(server.data, ignore_errors=True)


if __name__ == "__main__":
    main()
