"""Ollama's API against stackd's OpenAI API on one daemon, the same model and the same work:
does the dialect cost anything measurable?

One daemon (`serve --ollama`, the default SmolLM2-135M Q4_1); C closed-loop clients each stream
a chat answer and send the next until the time is up, first through POST /v1/chat/completions
(server-sent events), then through POST /api/chat (NDJSON), the same conversation, greedy, the
same token budget. Greedy answers are the same text on both routes, so each does the same work.
Ollama itself is not measured here: its Linux build is on neither PyPI nor Debian, the only
registries this machine reaches.

    .venv/bin/python bench/ollama_api.py [--clients 1 16] [--seconds 20] [--tokens 128] [--rounds 4]

Reports completion tokens/s (the pieces each answer streamed: one a token), time to first
piece p50/p95 and the gap between pieces p50/p95, per API and client count.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loadgen import RequestResult, _body_chunks, _quantile  # noqa: E402
from testing.daemon import Daemon  # noqa: E402

CHAT = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Tell me a long story about a curious girl who explores a forest."}]


def openai_body(tokens: int) -> dict:
    return {"model": CHAT, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0, "stream": True}


def ollama_body(tokens: int) -> dict:
    return {"model": CHAT, "messages": MESSAGES, "options": {"num_predict": tokens, "temperature": 0}}


def pieces_openai(buffer: bytes):
    """(texts of the complete events in buffer, what is left)."""
    out = []
    while b"\n\n" in buffer:
        event, buffer = buffer.split(b"\n\n", 1)
        if event.startswith(b"data: ") and event[6:] != b"[DONE]":
            for choice in orjson.loads(event[6:]).get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    out.append(choice["delta"]["content"])
    return out, buffer


def pieces_ollama(buffer: bytes):
    out = []
    while b"\n" in buffer:
        line, buffer = buffer.split(b"\n", 1)
        if line.strip():
            content = orjson.loads(line).get("message", {}).get("content")
            if content:
                out.append(content)
    return out, buffer


async def one(port: int, path: str, body: dict, key: str, split) -> RequestResult:
    result = RequestResult()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = orjson.dumps(body)
    writer.write((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                  ).encode() + payload)
    result.start = time.perf_counter()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{path}: {head.splitlines()[0]!r} {await reader.read(2000)!r}")
        buffer = b""
        async for data in _body_chunks(reader, head):
            buffer += data
            texts, buffer = split(buffer)
            for _ in texts:
                result.token()
        result.complete = True
    finally:
        writer.close()
    return result


async def load(port: int, path: str, body: dict, key: str, split, clients: int, seconds: float):
    deadline = time.perf_counter() + seconds
    results: list[RequestResult] = []

    async def client():
        while time.perf_counter() < deadline:
            results.append(await one(port, path, body, key, split))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return results, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds per client count, the two routes in turn (the first alternating): "
                             "a drift in the machine's load falls on both; the medians and their ratio")
    args = parser.parse_args()
    slots = max(args.clients)
    daemon = Daemon(tempfile.mkdtemp(prefix="bench-ollama-") + "/data",
                    f"[models]\npreload = [\"{CHAT}\"]\n[rate_limits]\ninference = 0\n"
                    f"[engine]\nslots = {slots}\ncontext_length = 1024\n", models=True, ollama=True)
    try:
        routes = [("openai /v1/chat/completions", daemon.inference_port, "/v1/chat/completions",
                   openai_body(args.tokens), pieces_openai),
                  ("ollama /api/chat", daemon.ollama_port, "/api/chat", ollama_body(args.tokens), pieces_ollama)]
        for _, port, path, body, split in routes:          # warm both paths once
            asyncio.run(load(port, path, body, daemon.admin_key, split, 1, 0.1))
        print(f"{'api':30} {'clients':>7} {'tok/s':>8} {'ttft p50':>9} {'p95':>7} {'gap p50':>8} {'p95':>7}")
        for clients in args.clients:
            rates: dict[str, list[float]] = {name: [] for name, *_ in routes}
            for i in range(args.rounds):
                for name, port, path, body, split in (routes if i % 2 == 0 else routes[::-1]):
                    results, elapsed = asyncio.run(load(port, path, body, daemon.admin_key, split, clients,
                                                        args.seconds))
                    ttfts = [r.ttft for r in results if r.ttft is not None]
                    gaps = [g for r in results for g in r.gaps]
                    rates[name].append(sum(r.tokens for r in results) / elapsed)
                    print(f"{name:30} {clients:7d} {rates[name][-1]:8.1f} "
                          f"{_quantile(ttfts, 0.5) * 1000:8.1f}ms {_quantile(ttfts, 0.95) * 1000:6.1f}ms "
                          f"{_quantile(gaps, 0.5) * 1000:7.2f}ms {_quantile(gaps, 0.95) * 1000:6.2f}ms", flush=True)
            if args.rounds > 1:
                (a, ra), (b, rb) = ((name, statistics.median(v)) for name, v in rates.items())
                print(f"{clients} clients, medians of {args.rounds} rounds: {b} {rb:.1f} tok/s, {a} {ra:.1f} "
                      f"tok/s: {rb / ra:.2f}x", flush=True)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
