"""What a long engine trace costs the daemon's event loop: a /v1/health probe every 5 ms on the
cluster port (it shares the one loop) while 16 clients stream completions and a trace of
--seconds (60 by default) records the chat model, then is collected, turned into Chrome trace
events and encoded. Worst and 99th-percentile probe latency before the trace (the load alone),
while it records, and while it is collected (from the end of the recording to the answer).

With workers (the default isolation) the records cross the wire as one frame tail and are
decoded and encoded a chunk at a time; inline, the native engine hands its records over in one
call on the loop. Both are measured unless --isolation names one.

    .venv/bin/python bench/trace_lag.py [--seconds 60] [--clients 16] [--isolation worker]
    .venv/bin/python bench/trace_lag.py --replay 100000   # the daemon's side alone, no model
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import sys
import statistics
import tempfile
import threading
import time

import orjson

import loadgen
from loop_lag import probe

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing.daemon import Daemon  # noqa: E402

CHAT = "smollm2-135m-instruct"
STREAM = {"model": CHAT, "prompt": "Once upon a time", "stream": True, "max_tokens": 64,
          "temperature": 0, "ignore_eos": True}


def record_trace(node: Daemon, seconds: float, marks: dict) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", node.cluster_port, timeout=600)
    marks["start"] = time.perf_counter()
    conn.request("POST", "/v1/debug/trace", orjson.dumps({"seconds": seconds, "model": CHAT}),
                 {"Authorization": f"Bearer {node.admin_key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    body = response.read()
    marks["answered"] = time.perf_counter()
    assert response.status == 200, body[:500]
    trace = orjson.loads(body)
    marks["bytes"], marks["events"] = len(body), len(trace["traceEvents"])
    marks["lost"] = trace["otherData"]["lost"]


def summary(latencies: list[float]) -> str:
    if not latencies:
        return "no samples"
    p99 = f", p99 {statistics.quantiles(latencies, n=100)[98] * 1000:5.1f} ms" if len(latencies) >= 100 else ""
    return f"worst {max(latencies) * 1000:6.1f} ms{p99} ({len(latencies)} probes)"


def measure(isolation: str, seconds: float, clients: int) -> None:
    with tempfile.TemporaryDirectory(prefix="stackd-trace-lag-") as tmp:
        node = Daemon(os.path.join(tmp, "data"), "[http]\naccess_log = false\n"
                      "[rate_limits]\ninference = 0\ncluster = 0\n"
                      f"[engine]\nslots = {clients}\ncontext_length = 512\nisolation = \"{isolation}\"\n",
                      models=True)
        try:
            stop, samples, marks = threading.Event(), [], {}
            load = threading.Thread(target=lambda: asyncio.run(
                loadgen.run(node.inference_port, STREAM, clients, seconds + 25, node.admin_key)))
            load.start()
            time.sleep(5.0)                                  # the load is running
            prober = threading.Thread(target=probe, args=(node, stop, samples))
            prober.start()
            time.sleep(5.0)
            record_trace(node, seconds, marks)
            time.sleep(1.0)
            stop.set()
            prober.join()
            load.join()
        finally:
            node.stop()
    recording_end = marks["start"] + seconds
    phases = {
        "load alone": [lat for t, lat in samples if t + lat < marks["start"]],
        "recording": [lat for t, lat in samples if marks["start"] <= t and t + lat < recording_end],
        "collecting": [lat for t, lat in samples if t + lat >= recording_end and t <= marks["answered"]],
    }
    print(f"{isolation}: {seconds:g} s trace under {clients} streaming clients: {marks['events']} events, "
          f"{marks['bytes'] / 1e6:.1f} MB, answered {marks['answered'] - recording_end:.2f} s after the "
          f"recording ended, lost {marks['lost'] or 'none'}", flush=True)
    for name, latencies in phases.items():
        print(f"  {name:11s} /v1/health {summary(latencies)}", flush=True)


def replayed(n_records: int) -> None:
    """The daemon's side alone, with no model: a worker's trace frame of n synthetic records
    (steps, prefill chunks and requests, as the engine makes them) is received in 1 MiB reads,
    decoded, turned into events and encoded by server/observe/trace.py, while a task measures
    the longest the loop waited for a turn, in CPU time of this thread (a busy machine's
    preemptions are not the code's), and in wall time. Independent of how busy the engine is."""
    from stackd.engine import wire
    from stackd.observe import trace

    phases = {"schedule": 40, "batch": 30, "decode": 30000, "sample": 200, "emit": 50}
    kinds = [{"kind": "step", "t_begin_us": 0, "t_end_us": 30320, "phase_us": phases, "n_items": 16,
              "n_tokens": 16, "n_sampled": 16},
             {"kind": "prefill", "id_request": 0, "t_begin_us": 0, "t_end_us": 30000, "n_tokens": 12},
             {"kind": "request", "id_request": 0, "status": 1, "t_begin_us": 0, "t_end_us": 900000,
              "t_admit_us": 10, "t_first_us": 40000, "t_last_us": 900000, "n_tokens": 64, "n_prompt": 12,
              "n_cached": 0}]
    records = [{**kinds[i % 3], "t_begin_us": i * 1000} for i in range(n_records)]
    sizes, n_dropped, tail = wire.encode_trace(records)
    data = wire.frame({"op": "trace", "seq": 1, "chunks": sizes, "n_dropped": n_dropped}, tail)

    class Replayed:
        """A worker's client whose stop answers the frame above, read as take_events reads."""
        pid = 4242

        async def trace_start(self) -> bool:
            return True

        async def trace_stop(self):
            reader = wire.FrameReader()
            for at in range(0, len(data), 1 << 20):
                frames = reader.feed(data[at:at + (1 << 20)])
                await asyncio.sleep(0)                 # one read per readiness callback
            [(header, got)] = frames
            return wire.decode_trace(header["chunks"], got), header["n_dropped"]

    async def run() -> tuple[float, float, float, int]:
        gaps, cpu_gaps, done = [0.0], [0.0], asyncio.Event()

        async def ticker():
            last, last_cpu = time.perf_counter(), time.thread_time()
            while not done.is_set():
                await asyncio.sleep(0)
                now, now_cpu = time.perf_counter(), time.thread_time()
                gaps.append(now - last)
                cpu_gaps.append(now_cpu - last_cpu)
                last, last_cpu = now, now_cpu
        ticking = asyncio.create_task(ticker())
        began = time.perf_counter()
        recorded = await trace.record(object(), {"m": Replayed()}, 0, 60)
        n_bytes = 0
        async for part in recorded.stream():      # as the HTTP layer takes it
            n_bytes += len(part)
        elapsed = time.perf_counter() - began
        done.set()
        await ticking
        return max(gaps), max(cpu_gaps), elapsed, n_bytes

    worst, worst_cpu, elapsed, n_bytes = asyncio.run(run())
    print(f"replayed: {n_records} records, a {len(data) / 1e6:.1f} MB frame -> {n_bytes / 1e6:.1f} MB of "
          f"trace JSON in {elapsed:.2f} s; the loop's longest wait for a turn: {worst_cpu * 1000:.1f} ms "
          f"of CPU ({worst * 1000:.1f} ms of wall time)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--isolation", choices=["worker", "inline"])
    parser.add_argument("--replay", type=int, metavar="N",
                        help="only the daemon's side: a worker's frame of N synthetic records, no model")
    args = parser.parse_args()
    if args.replay:
        replayed(args.replay)
        return
    for isolation in [args.isolation] if args.isolation else ["worker", "inline"]:
        measure(isolation, args.seconds, args.clients)


if __name__ == "__main__":
    main()
