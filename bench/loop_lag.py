"""How long the event loop stalls while a large body is handled beside a stream: the worst
latency of a /v1/health probe every 5 ms (on the other port, so it measures the shared loop),
while a 1 MiB completion prompt and a 2,048-input embedding request are tokenized and a stream
runs. Goal (engine-worker issue): worst lag under 20 ms.

    .venv/bin/python bench/loop_lag.py
"""
from __future__ import annotations

import asyncio
import http.client
import os
import sys
import tempfile
import threading
import time

import loadgen

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing.daemon import Daemon  # noqa: E402

CHAT = "smollm2-135m-instruct"
STREAM = {"model": CHAT, "prompt": "Once upon a time", "stream": True, "max_tokens": 200,
          "temperature": 0, "logit_bias": {"0": -100, "2": -100}}


def probe(node: Daemon, stop: threading.Event, samples: list) -> None:
    """(when, latency) of a /v1/health every 5 ms, on a kept-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", node.cluster_port, timeout=600)
    while not stop.is_set():
        t = time.perf_counter()
        conn.request("GET", "/v1/health", headers={"Authorization": f"Bearer {node.admin_key}"})
        conn.getresponse().read()
        samples.append((t, time.perf_counter() - t))
        time.sleep(0.005)


def main() -> None:
    import argparse
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()   # --help
    with tempfile.TemporaryDirectory(prefix="stackd-lag-") as tmp:
        node = Daemon(os.path.join(tmp, "data"), "[http]\naccess_log = false\nmax_body_bytes = 4194304\n"
                      "[rate_limits]\ninference = 0\ncluster = 0\n"
                      "[engine]\nslots = 4\ncontext_length = 512\n", models=True)
        try:
            big_prompt = "the quick brown fox jumps over the lazy dog " * ((1 << 20) // 44)
            loads = {
                "idle (stream only)": None,
                "1 MiB completion prompt": lambda: loadgen.post_json(node.inference_port, "/v1/completions", node.admin_key,
                                                        {"model": CHAT, "prompt": big_prompt, "max_tokens": 1}),
                "2,048 embedding inputs": lambda: loadgen.post_json(node.inference_port, "/v1/embeddings", node.admin_key, {
                    "model": "all-minilm-l6-v2", "input": ["a sentence of ordinary length to embed"] * 2048}),
            }
            for name, load in loads.items():
                stop, samples = threading.Event(), [(0.0, 0.0)]
                prober = threading.Thread(target=probe, args=(node, stop, samples))
                prober.start()
                streaming = threading.Thread(target=lambda: asyncio.run(
                    loadgen.run(node.inference_port, STREAM, 1, 8.0, node.admin_key)))
                streaming.start()
                time.sleep(1.0)
                status = load() if load else None
                streaming.join()
                stop.set()
                prober.join()
                worst = max(latency for _, latency in samples)
                print(f"  {name:26s} worst /v1/health latency {worst * 1000:7.1f} ms"
                      + (f"   (the load answered {status})" if status else ""), flush=True)
        finally:
            node.stop()


if __name__ == "__main__":
    main()
