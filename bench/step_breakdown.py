"""Where a decode step's time goes in stackd at 16 and 32 concurrent streams.

The engine counts, per phase, the wall time its scheduler thread spends (schedule,
llama_decode, sampling with detokenization, emitting events); /metrics exposes the
counters. CPU time per thread comes from /proc/<pid>/task: the event-loop thread is
"Python" (HTTP, JSON, SSE), the rest is native (the engine thread and ggml's workers).

    .venv/bin/python bench/step_breakdown.py [--seconds 20]
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import re

import loadgen
from inference import body, start_stackd


def engine_counters(server) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", server.cluster_port, timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {server.key}"})
    text = conn.getresponse().read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^stackd_engine_(\w+)_total\{[^}]*\} (\S+)$", text, re.M)}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name, the main (event loop) thread as 'python'."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        name = "python" if tid == str(pid) else "native"
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    for clients in (16, 32):
        server = start_stackd(clients, 512, args.threads)
        try:
            asyncio.run(loadgen.run(server.port, body(server.model, 8), 1, 2.0, server.key))
            before, cpu_before = engine_counters(server), thread_cpu(server.proc.pid)
            result = asyncio.run(loadgen.run(server.port, body(server.model, 128), clients,
                                             args.seconds, server.key))
            after, cpu_after = engine_counters(server), thread_cpu(server.proc.pid)
        finally:
            server.stop()
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        steps = max(d["n_steps"], 1)
        cpu = {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after}
        wall_ms = (d["t_schedule_us"] + d["t_batch_us"] + d["t_decode_us"] + d["t_sample_us"]
                   + d["t_emit_us"]) / 1000 / steps
        print(f"c={clients}: {result.tokens_per_second():.1f} tok/s, {d['n_steps']:.0f} steps, "
              f"{d['n_tokens_sampled'] / steps:.1f} tokens sampled per step, "
              f"{wall_ms:.2f} ms per step in the engine thread:")
        for name in ("t_schedule_us", "t_batch_us", "t_decode_us", "t_sample_us", "t_emit_us"):
            share = d[name] / max(1.0, sum(d[k] for k in d if k.startswith("t_")))
            print(f"    {name[2:-3]:9s} {d[name] / 1000 / steps:7.3f} ms/step  {share * 100:5.1f} %")
        total_cpu = sum(cpu.values())
        print(f"    CPU over the run: python (event loop) {cpu.get('python', 0):.1f} s, "
              f"native {cpu.get('native', 0):.1f} s "
              f"({cpu.get('python', 0) / max(total_cpu, 1e-9) * 100:.1f} % python)")


if __name__ == "__main__":
    main()
