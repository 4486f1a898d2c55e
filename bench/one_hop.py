"""Time to a chat's first token and 1-token chats per second: this tree against an earlier one,
side by side in one run (issue 47's "one hop to the engine": the rendered prompt goes to the
worker with the submit, which tokenizes it there, instead of a tokenize round trip first).

    .venv/bin/python bench/one_hop.py --before /path/to/older/checkout [--rounds 3]

`--before` is a checkout whose server/ has its native modules built in place (`make setup` or
`setup.py build_ext --inplace` there, or the .so files copied from this tree when the native
code is the same); it runs as the package `stackd` through PYTHONPATH, beside this tree's
editable install. Without it, only this tree is measured.

Each round starts one daemon per tree (one worker, SmolLM2, 16 slots), alternating which goes
first, and measures on each:
- the short chat: a one-line user turn, max_tokens 1, not streamed, one client, one after
  another: the answer's whole latency (render, tokenize, submit, prefill, one token);
- the long chat: a ~1,000-token user turn, the same (each prompt starts with its own number, so
  no request reuses another's KV prefix);
- 1-token chats per second with 16 clients on keep-alive connections.
Medians over the requests of a round, then over rounds; the ratios are before / this tree.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time

import orjson

import inference
from kernels_engine import cpu_name

WORDS = ("the device reads its sensors and reports each one's state to the hub while the lights in "
         "the kitchen stay on and the thermostat holds the living room at twenty degrees ").split()


def long_text(n_words: int) -> str:
    return " ".join(itertools.islice(itertools.cycle(WORDS), n_words))


class Client:
    """One keep-alive connection posting JSON and reading whole answers (Content-Length)."""

    def __init__(self, port: int, key: str):
        self.port, self.key = port, key
        self.reader = self.writer = None

    async def post(self, path: str, body: dict) -> dict:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        payload = orjson.dumps(body)
        self.writer.write((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.key}\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
                          + payload)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        answer = orjson.loads(await self.reader.readexactly(length))
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{head.splitlines()[0]!r}: {answer}")
        return answer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def chat(model: str, text: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1,
            "temperature": 0.0}


async def latencies(server, texts: list[str]) -> list[float]:
    client = Client(server.port, server.key)
    out = []
    try:
        for text in texts:
            started = time.perf_counter()
            await client.post("/v1/chat/completions", chat(server.model, text))
            out.append(time.perf_counter() - started)
    finally:
        client.close()
    return out


async def rate(server, clients: int, seconds: float) -> float:
    deadline = time.perf_counter() + seconds
    counter = itertools.count()
    done = 0

    async def one() -> None:
        nonlocal done
        client = Client(server.port, server.key)
        try:
            while time.perf_counter() < deadline:
                await client.post("/v1/chat/completions", chat(server.model, f"Say hi {next(counter)}."))
                done += 1
        finally:
            client.close()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return done / (time.perf_counter() - started)


def start(tree: str | None, threads: int):
    env = None
    if tree is not None:                     # the older tree as the package `stackd`
        shim = tempfile.mkdtemp(prefix="stackd-before-")
        os.symlink(os.path.join(os.path.abspath(tree), "server"), os.path.join(shim, "stackd"))
        env = {"PYTHONPATH": shim}
    return inference.start_stackd(16, 2048, threads, env=env)


def measure(tree: str | None, args, round_no: int) -> dict:
    server = start(tree, args.threads)
    try:
        loop = asyncio.new_event_loop()
        base = round_no * 1000 + (0 if tree is None else 500)
        loop.run_until_complete(latencies(server, ["Hello there."] * 3))          # warm
        short = loop.run_until_complete(latencies(server, [f"Say hello, number {base + i}." for i in range(args.requests)]))
        body = long_text(args.long_words)
        long = loop.run_until_complete(latencies(server, [f"{base + i}: {body}" for i in range(args.long_requests)]))
        per_second = loop.run_until_complete(rate(server, args.clients, args.seconds))
        loop.close()
    finally:
        server.stop()
    return {"short": statistics.median(short), "long": statistics.median(long), "rate": per_second}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="an older checkout (its server/ built in place)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=30, help="short chats per round")
    parser.add_argument("--long-requests", type=int, default=8)
    parser.add_argument("--long-words", type=int, default=800, help="~1,000 tokens with SmolLM2's vocabulary")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    trees = [("this tree", None)] + ([("before", args.before)] if args.before else [])
    rows = {name: [] for name, _ in trees}
    print(f"CPU: {cpu_name()}, {args.threads} threads", flush=True)
    for r in range(args.rounds):
        for name, tree in (trees if r % 2 == 0 else trees[::-1]):
            rows[name].append(measure(tree, args, r))
            m = rows[name][-1]
            print(f"round {r + 1} {name:>9}: short {m['short'] * 1e3:.2f} ms, long {m['long'] * 1e3:.1f} ms, "
                  f"{m['rate']:.1f} chats/s at {args.clients}", flush=True)
    print(f"\nmedians of {args.rounds} rounds ({args.requests} short and {args.long_requests} long chats, "
          f"{args.clients} clients for {args.seconds:.0f} s):")
    print("| tree | short chat, 1 client | ~1,000-token chat, 1 client | 1-token chats/s, 16 clients |")
    print("|---|---|---|---|")
    medians = {}
    for name, _ in trees:
        medians[name] = {k: statistics.median(m[k] for m in rows[name]) for k in ("short", "long", "rate")}
        m = medians[name]
        print(f"| {name} | {m['short'] * 1e3:.2f} ms | {m['long'] * 1e3:.1f} ms | {m['rate']:.1f} |")
    if args.before:
        a, b = medians["this tree"], medians["before"]
        print(f"| before / this tree | {b['short'] / a['short']:.3f}x | {b['long'] / a['long']:.3f}x | "
              f"{a['rate'] / b['rate']:.3f}x (this tree / before) |")


if __name__ == "__main__":
    sys.exit(main())
