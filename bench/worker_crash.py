"""Worker crash recovery: kill -9 the chat model's worker in the middle of streams and measure
how long the clients wait for the documented error, and how long until the model serves again.

    .venv/bin/python bench/worker_crash.py [--runs 3] [--streams 8]

For each run: `--streams` streaming completions run (end-of-generation suppressed, so they are
mid-stream); the worker named by /v1/nodes is killed with SIGKILL; the script reports
  * crash -> first error: until the first stream ends with its error event (or a 503),
  * crash -> last error:  until every stream has ended,
  * crash -> serving:     until a new completion answers 200 again (restart backoff included).
Medians over the runs. The engine-worker issue asks for these figures in the README.
"""
from __future__ import annotations

import argparse
import asyncio
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
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
