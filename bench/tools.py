"""Tool calling's cost: plain tokens/s at N clients, and a forced tool call against a plain
answer of the same length.

1. N clients stream plain answers (no tools) for --seconds: tokens/s. With --before PYTHON (the
   interpreter of a checkout from before the tools work, e.g. /tmp/before/.venv/bin/python), a
   daemon of that checkout is measured too, in alternating rounds: the plain path's ratio.
2. One client alternates a forced tool call (tool_choice required: the generic JSON form and its
   grammar on the default model) with a plain answer of exactly as many tokens (ignore_eos,
   max_tokens = the call's completion tokens); medians of --pairs each: the overhead per token.

    .venv/bin/python bench/tools.py --seconds 20 --clients 16 --pairs 10 [--before PY --rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from testing.daemon import Daemon  # noqa: E402

CHAT = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def plain_throughput(client, clients: int, seconds: float) -> float:
    tokens = [0] * clients
    stop = time.monotonic() + seconds

    def run(i):
        while time.monotonic() < stop:
            reply = client.chat.completions.create(model=CHAT, messages=ASK, max_tokens=64,
                                                   temperature=0.8, seed=i)
            tokens[i] += reply.usage.completion_tokens

    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.monotonic() - start)


def timed(call) -> tuple[float, int]:
    start = time.perf_counter()
    reply = call()
    return time.perf_counter() - start, reply.usage.completion_tokens


def client_of(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{daemon.inference_port}/v1",
                         api_key=daemon.admin_key, max_retries=0, timeout=300)


def compare_plain(client, before: Daemon, args) -> None:
    """This checkout's plain path against --before's, in alternating rounds (medians)."""
    try:
        old = client_of(before)
        now_rates, old_rates = [], []
        for r in range(args.rounds):
            order = [(client, now_rates), (old, old_rates)]
            for c, rates in (order if r % 2 == 0 else order[::-1]):
                rates.append(plain_throughput(c, args.clients, args.seconds))
        now, then = statistics.median(now_rates), statistics.median(old_rates)
        print(f"plain, {args.clients} clients, {args.seconds:g} s, medians of {args.rounds}: "
              f"{now:.1f} tokens/s now, {then:.1f} before: {now / then:.3f}x")
    finally:
        before.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--before", help="another checkout's python: its plain path, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds with --before")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        config = f"[rate_limits]\ninference = 0\n[engine]\nslots = {max(args.clients, 4)}\n"
        daemon = Daemon(os.path.join(tmp, "data"), config, models=True)
        try:
            client = client_of(daemon)
            if args.before:
                compare_plain(client, Daemon(os.path.join(tmp, "before"), config, models=True,
                                             python=args.before), args)
            else:
                rate = plain_throughput(client, args.clients, args.seconds)
                print(f"plain, {args.clients} clients, {args.seconds:g} s: {rate:.1f} tokens/s")
            tool_times, plain_times = [], []
            for i in range(args.pairs):
                t, n = timed(lambda: client.chat.completions.create(
                    model=CHAT, messages=ASK, tools=[WEATHER], tool_choice="required",
                    temperature=0.8, seed=i, max_tokens=200))
                tool_times.append(t / n)
                t, m = timed(lambda: client.chat.completions.create(
                    model=CHAT, messages=ASK, temperature=0.8, seed=i, max_tokens=n,
                    extra_body={"ignore_eos": True}))
                plain_times.append(t / m)
            tool, plain = statistics.median(tool_times), statistics.median(plain_times)
            print(f"forced tool call: {tool * 1000:.2f} ms/token; plain answer of the same length: "
                  f"{plain * 1000:.2f} ms/token; overhead {tool / plain:.2f}x "
                  f"(medians of {args.pairs}; the tool request's prompt also carries the tools)")
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
