"""Engine worker against inline in alternating rounds: single-client inter-token latency, or
tokens/s at many clients (--clients 16).

A ratio of two ITL medians taken minutes apart moves by more than the 3 % it is meant to
judge (bench/README.md, "Engine worker against inline"): the CPU's frequency and whatever
else runs drift between the two runs. Here both daemons are up at once (the one not measured is
idle) and short rounds alternate, worker, inline, inline, worker, ... (ABBA, so a drift within a
pair does not favour one side); each pair gives a ratio, and the median of the pairs' ratios is
the figure.

    .venv/bin/python bench/isolation_itl.py [--pairs 8] [--seconds 6] [--threads 2] [--clients 1]

Same request as bench/inference.py (128 greedy tokens, end-of-generation suppressed), 16 slots
of 512 tokens, the chat model only. Targets (engine-worker issue): ITL p50 at one client
worker <= 1.03x inline; tokens/s at 16 clients worker >= 0.98x inline. Runs of each one after
the other moved by more than that with no change between them (bench/README.md).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys

import loadgen
from inference import body, start_stackd


def measure(server, seconds: float, clients: int) -> float:
    """ITL p50 in ms at one client; tokens/s at more."""
    result = asyncio.run(loadgen.run(server.port, body(server.model, 128), clients, seconds, server.key))
    return result.itl(0.5) * 1000 if clients == 1 else result.tokens_per_second()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--clients", type=int, default=1, help="1: ITL p50; more: tokens/s")
    args = parser.parse_args()
    servers = {}
    try:
        for mode in ("worker", "inline"):
            servers[mode] = start_stackd(16, 512, args.threads, mode)
            measure(servers[mode], 2.0, args.clients)                    # warm up
        unit = "ms" if args.clients == 1 else "tok/s"
        ratios = []
        print(f"{'pair':>4s} {'worker ' + unit:>12s} {'inline ' + unit:>12s} {'ratio':>7s}")
        for pair in range(args.pairs):
            order = ("worker", "inline") if pair % 2 == 0 else ("inline", "worker")
            got = {mode: measure(servers[mode], args.seconds, args.clients) for mode in order}
            ratios.append(got["worker"] / got["inline"])
            print(f"{pair + 1:4d} {got['worker']:12.2f} {got['inline']:12.2f} {ratios[-1]:7.3f}", flush=True)
        ratios = [r for r in ratios if r == r]          # a round with no whole request gives nan
        if not ratios:
            sys.exit("no round finished a request: the machine is too busy to measure")
        what, target = (("single-client ITL p50", "<= 1.03x") if args.clients == 1
                        else (f"tokens/s at {args.clients} clients", ">= 0.98x"))
        print(f"\n{what}, worker / inline: median of {len(ratios)} pairs "
              f"{statistics.median(ratios):.3f}x (range {min(ratios):.3f}-{max(ratios):.3f}; target {target})")
    finally:
        for server in servers.values():
            server.stop()
            shutil.rmtree(server.data, ignore_errors=True)


if __name__ == "__main__":
    main()
