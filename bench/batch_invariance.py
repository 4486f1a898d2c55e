"""What engine.batch_invariant costs (kernels/README.md, "One arithmetic per row"): the engine with
our kernels and ggml's CPU ops on their per-row paths against the default (ggml's own tiled and
KV-split paths), in one run, alternating rounds, medians.

    .venv/bin/python bench/batch_invariance.py [--rounds 3] [--threads 2] [--model PATH]

Each round and mode runs in its own process (kernel registration is per process): a 1,000-token
prompt prefilled alone (where the tiled attention path would apply), then 32-token prompts
decoding 128 tokens at 1 and 16 streams. The CPU's name heads the output.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time

from kernels_engine import ROOT, cpu_name, median, model_path, run_streams

LONG_PROMPT_TOKENS = 1000
STREAMS = (1, 16)


def prefill_alone(engine, tokens: int) -> float:
    """Prompt tokens/s of one long prompt, to its first generated token."""
    from stackd.engine.core import SUBMIT_ACCEPTED, SamplingParams
    params = SamplingParams()
    params.temperature = 0.0
    text = " ".join(f"item {i} costs {i * 7 % 100} coins;" for i in range(tokens))
    prompt = engine.tokenize(text, False, True)[:tokens]
    start = time.perf_counter()
    assert engine.submit(99_999, prompt, 1, [], params) == SUBMIT_ACCEPTED
    while True:
        select.select([engine.fileno()], [], [])
        if engine.take_events():
            return tokens / (time.perf_counter() - start)


def child(invariant: bool, threads: int, model: str | None) -> None:
    from stackd.engine import accel
    accel.register("auto", batch_invariant=invariant)
    from stackd.engine.core import Engine
    engine = Engine(model_path(model), slots=max(STREAMS), context_length=LONG_PROMPT_TOKENS + 64,
                    batch=512, threads=threads, flash_attn=1)
    run_streams(engine, 2, 1)  # warm up
    out = {"prefill_long": prefill_alone(engine, LONG_PROMPT_TOKENS)}
    for i, n in enumerate(STREAMS):
        out[str(n)] = run_streams(engine, n, 1000 * (i + 1))
    engine.close()
    print(json.dumps(out))


def measure(invariant: bool, threads: int, model: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", "on" if invariant else "off", "--threads", str(threads)]
    out = subprocess.run(cmd + (["--model", model] if model else []), check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child == "on", args.threads, args.model)
    rows = {f"prefill, {LONG_PROMPT_TOKENS}-token prompt alone": lambda r: r["prefill_long"],
            **{f"decode, {n} streams": (lambda r, n=n: r[str(n)]["decode"]) for n in STREAMS},
            f"prefill, {STREAMS[-1]} x 32-token prompts": lambda r: r[str(STREAMS[-1])]["prefill"]}
    ratios: dict[str, list[float]] = {name: [] for name in rows}
    print(f"{cpu_name()}; {os.path.basename(model_path(args.model))}; {args.threads} threads", flush=True)
    for r in range(args.rounds):
        on, off = measure(True, args.threads, args.model), measure(False, args.threads, args.model)
        for name, get in rows.items():
            ratios[name].append(get(on) / get(off))
        print(f"round {r + 1}: " + ", ".join(f"{name} {get(on):.1f} / {get(off):.1f} tok/s"
                                               for name, get in rows.items()), flush=True)
    print(f"batch_invariant on / off (default), {args.rounds} alternating rounds")
    print("| | median | min | max |\n|---|---|---|---|")
    for name, values in ratios.items():
        print(f"| {name} | {median(values):.2f}x | {min(values):.2f}x | {max(values):.2f}x |")


if __name__ == "__main__":
    main()
