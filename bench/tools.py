"""Tool calling's cost: plain tokens/s at N clients, and a forced tool call against a plain
answer of the same length.

1. N clients stream plain answers (no tools) for --seconds: tokens/s. Compare the figure with
   the same run on a checkout before the tools work (the plain path is the code it was).
2. One client alternates a forced tool call (tool_choice required: the generic JSON form and its
   grammar on the default model) with a plain answer of exactly as many tokens (ignore_eos,
   max_tokens = the call's completion tokens); medians of --pairs each: the overhead per token.

    .venv/bin/python bench/tools.py --seconds 20 --clients 16 --pairs 10
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

from stackd.testing.daemon import Daemon  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        daemon = Daemon(os.path.join(tmp, "data"), "[rate_limits]\ninference = 0\n"
                        f"[engine]\nslots = {max(args.clients, 4)}\n", models=True)
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{daemon.inference_port}/v1",
                                   api_key=daemon.admin_key, max_retries=0, timeout=300)
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
