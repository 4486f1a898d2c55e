"""Model store benchmarks, side by side in one run.

1. Pull throughput: stackd's blob download (streamed sha256, write, fsync, verify, rename)
   against curl downloading the same blob from the same local registry (the CNCF
   distribution registry, Debian's docker-registry, on loopback). Target >= 0.9x curl.
2. Load to first token: POST /v1/models/load for the default chat model, then a streaming
   chat request, until its first token; against llama-server started on the same file,
   from process start to the first token of the same request.

    .venv/bin/python bench/model_store.py [--blob-mb 256] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import peers
from inference import free_port, start_stackd, wait_ready

from stackd.store import oci
from stackd.store.defaults import CHAT_MODEL, smollm2_path
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing.registry_server import MEDIA_MODEL, RegistryServer  # noqa: E402

CHAT_BODY = (b'{"model": "%s", "stream": true, "max_tokens": 8, "messages": '
             b'[{"role": "user", "content": "Hello"}]}')


def bench_pull(blob_mb: int, rounds: int) -> tuple[float, float]:
    blob = os.urandom(blob_mb << 20)
    with tempfile.TemporaryDirectory(prefix="pull-bench-") as work:
        registry = RegistryServer(os.path.join(work, "registry")).start()
        try:
            pushed = registry.push_model("library/bench", "latest", [(MEDIA_MODEL, blob)])
            _, digest, size = pushed["layers"][0]
            url = f"{registry.url}/v2/library/bench/blobs/{digest}"
            ours, theirs = [], []
            for _ in range(rounds):
                out = os.path.join(work, "curl.bin")
                started = time.perf_counter()
                subprocess.run(["curl", "-sSfL", "-o", out, url], check=True)
                theirs.append(time.perf_counter() - started)
                os.unlink(out)

                blobs = os.path.join(work, "blobs")
                shutil.rmtree(blobs, ignore_errors=True)
                os.makedirs(blobs)
                started = time.perf_counter()
                asyncio.run(_fetch(registry.url, oci.Layer(MEDIA_MODEL, digest, size), blobs))
                ours.append(time.perf_counter() - started)
        finally:
            registry.stop()
    mb = blob_mb * (1 << 20) / 1e6
    return mb / statistics.median(ours), mb / statistics.median(theirs)


async def _fetch(url: str, layer, blobs: str) -> None:
    client = oci.RegistryClient(url)
    try:
        await client.fetch_blob(oci.parse_reference("bench"), layer, blobs)
    finally:
        await client.aclose()


def first_token(port: int, model: str, key: str | None) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("POST", "/v1/chat/completions", body=CHAT_BODY % model.encode(), headers=headers)
    response = conn.getresponse()
    while line := response.fp.readline():
        if line.startswith(b"data:") and b'"content"' in line and b'"content":""' not in line.replace(b" ", b""):
            break
    conn.close()


def bench_load(rounds: int) -> tuple[float, float]:
    server = start_stackd(16, 2048, os.cpu_count() or 2)
    ours = []
    try:
        for _ in range(rounds):
            _post(server.cluster_port, "/v1/models/unload", CHAT_MODEL, server.key)
            started = time.perf_counter()
            _post(server.cluster_port, "/v1/models/load", CHAT_MODEL, server.key)
            first_token(server.port, CHAT_MODEL, server.key)
            ours.append(time.perf_counter() - started)
    finally:
        server.stop()
        shutil.rmtree(server.data, ignore_errors=True)

    binary = peers.llama_server()
    theirs = []
    for _ in range(rounds):
        port = free_port()
        started = time.perf_counter()
        proc = subprocess.Popen([binary, "-m", smollm2_path(), "--host", "127.0.0.1", "--port", str(port),
                                 "-np", "16", "-c", str(16 * 2048), "--no-webui"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, proc, path="/health", timeout=120)
            first_token(port, "smollm2", None)
            theirs.append(time.perf_counter() - started)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return statistics.median(ours), statistics.median(theirs)


def _post(port: int, path: str, model: str, key: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, body=b'{"model": "%s"}' % model.encode(),
                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        sys.exit(f"{path} answered {response.status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blob-mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    ours, curl = bench_pull(args.blob_mb, args.rounds)
    print(f"pull of a {args.blob_mb} MiB blob from a local registry, median of {args.rounds}:")
    print(f"  stackd {ours:8.1f} MB/s   curl {curl:8.1f} MB/s   ratio {ours / curl:.2f}x (target >= 0.9x)")
    load, llama = bench_load(args.rounds)
    print(f"load to first token, {CHAT_MODEL}, 16 slots x 2048, median of {args.rounds}:")
    print(f"  stackd load+first token {load * 1000:7.0f} ms   llama-server start+first token "
          f"{llama * 1000:7.0f} ms   ratio {load / llama:.2f}x")


if __name__ == "__main__":
    main()
