"""Worker crash recovery: kill -9 the chat model's worker in the middle of streams and measure
how long the clients wait for the documented error, and how long until the model serves again.

    .venv/bin/python bench/worker_crash.py [--runs 3] [--streams 8]

For each run: `--streams` streaming completions run (end-of-generation suppressed, so they are
mid-stream); the worker named by /v1/nodes is killed with SIGKILL; the script reports
  * crash -> first error: until the first stream ends with its error event (or a 503),
  * crash -> last error:  until every stream has ended,
  * crash -> serving:     until a new completion answers 200 again (restart backoff included).
Medians over the runs; the figures are in bench/README.md ("Robustness").

    .venv/bin/python bench/worker_crash.py --load [--requests 400] [--clients 16] [--restart-hold 10]

`--load`: what a restart costs clients that do not retry (issue 24). `--clients` streaming clients
send `--requests` completions of 128 tokens between them, one after another each; once a quarter
of them are done the chat model's worker is killed once. Reported: requests that failed, split
into streams that had sent tokens (the cost of any crash) and requests with nothing sent yet,
those sent during the restart among them. `--restart-hold 0` is the daemon before requests were
held over a restart (engine.restart_hold): run both for the before/after.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import time

from inference import body, start_stackd


async def _request(port: int, key: str, payload: dict, method: str = "POST",
                   path: str = "/v1/completions") -> tuple[int, bytes]:
    """A minimal HTTP/1.1 client: returns the status and the whole body (streams included)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(payload).encode() if payload is not None else b""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + data)
    raw = await reader.read(-1)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


async def _stream_until_end(port: int, key: str, model: str, started: asyncio.Event,
                            ended: list) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body(model, 400)).encode()
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + data)
    seen_token = False
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        if not seen_token and b'"text"' in chunk:
            seen_token = True
            started.set()
        if b'"error"' in chunk:
            break
    ended.append(time.perf_counter())
    writer.close()


async def _worker_pid(server) -> int:
    status, raw = await _request(server.cluster_port, server.key, None, "GET", "/v1/nodes")
    for model in json.loads(raw)["data"][0]["models"]:
        if model["id"] == server.model:
            return model["pid"]
    raise RuntimeError("no worker for the chat model")


async def one_run(server, streams: int) -> tuple[float, float, float]:
    pid = await _worker_pid(server)
    started, ended = asyncio.Event(), []
    tasks = [asyncio.create_task(_stream_until_end(server.port, server.key, server.model, started, ended))
             for _ in range(streams)]
    await started.wait()
    await asyncio.sleep(0.5)                   # every stream is decoding
    crashed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    await asyncio.gather(*tasks)
    while True:
        status, _ = await _request(server.port, server.key, body(server.model, 4) | {"stream": False})
        if status == 200:
            serving = time.perf_counter()
            break
        await asyncio.sleep(0.02)
    return min(ended) - crashed, max(ended) - crashed, serving - crashed


async def _one_request(port: int, key: str, model: str) -> tuple[bool, bool, float]:
    """One streamed completion of 128 tokens: (failed, had sent tokens first, when it was sent)."""
    sent = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body(model, 128)).encode()
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + data)
    raw = await reader.read(-1)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    failed = int(head.split(b" ", 2)[1]) != 200 or b'"error"' in rest
    return failed, b'"text"' in rest, sent


async def under_load(server, requests: int, clients: int) -> dict:
    pid = await _worker_pid(server)
    results: list = []
    left = iter(range(requests))

    async def client():
        for _ in left:
            results.append(await _one_request(server.port, server.key, server.model))

    async def killer():
        while len(results) < requests // 4:
            await asyncio.sleep(0.05)
        crashed[0] = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        while True:
            with contextlib.suppress(RuntimeError, KeyError):
                if await _worker_pid(server) != pid:
                    break
            await asyncio.sleep(0.05)
        back[0] = time.perf_counter()

    crashed, back = [0.0], [0.0]
    await asyncio.gather(killer(), *(client() for _ in range(clients)))
    failed = [r for r in results if r[0]]
    return {"requests": len(results), "failed": len(failed),
            "failed, had sent tokens": sum(1 for r in failed if r[1]),
            "failed, nothing sent": sum(1 for r in failed if not r[1]),
            "sent during the restart": sum(1 for r in results if crashed[0] <= r[2] <= back[0]),
            "failed of those": sum(1 for r in failed if crashed[0] <= r[2] <= back[0]),
            "restart s": round(back[0] - crashed[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--load", action="store_true", help="requests failed by one kill under load")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--restart-hold", type=float, default=10.0, help="engine.restart_hold (0: before)")
    args = parser.parse_args()
    if args.load:
        server = start_stackd(slots=16, context=512, threads=args.threads,
                              engine=f"restart_hold = {args.restart_hold}\n")
        try:
            figures = asyncio.run(under_load(server, args.requests, args.clients))
        finally:
            server.stop()
            shutil.rmtree(server.data, ignore_errors=True)
        print(f"kill -9 under load, engine.restart_hold = {args.restart_hold:g}:")
        for name, value in figures.items():
            print(f"  {name:26s} {value}")
        return
    server = start_stackd(slots=max(8, args.streams), context=512, threads=args.threads)
    try:
        results = []
        for _ in range(args.runs):
            results.append(asyncio.run(one_run(server, args.streams)))
            time.sleep(1.0)
    finally:
        server.stop()
        shutil.rmtree(server.data, ignore_errors=True)
    first, last, serving = (statistics.median(r[i] for r in results) for i in range(3))
    print(f"worker kill -9 with {args.streams} streams, median of {args.runs}:")
    print(f"  crash -> first stream error {first * 1000:7.1f} ms")
    print(f"  crash -> last stream error  {last * 1000:7.1f} ms")
    print(f"  crash -> serving again      {serving * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
