"""What one arithmetic per row costs (kernels/README.md, "One arithmetic per row"): the engine with
our kernels and ggml's CPU ops on their per-row paths in decode steps (the default) and in every
step (engine.batch_invariant), each against ggml's own tiled and KV-split paths everywhere, in
one run, alternating rounds, medians.

    .venv/bin/python bench/batch_invariance.py [--rounds 3] [--threads 2] [--model PATH]

Each round and mode runs in its own process (kernel registration is per process): a 1,000-token
prompt prefilled alone (where the tiled attention path would apply) and 64 tokens decoded after
it (where the KV-split path would), then 32-token prompts decoding 128 tokens at 1 and 16
streams. The CPU's name heads the output.
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


def long_prompt_alone(engine, tokens: int, generate: int = 64) -> tuple[float, float]:
    """Prompt tokens/s of one long prompt to its first generated token, and decode tokens/s
    after it."""
    from stackd.engine.core import STATUS_RUNNING, SUBMIT_ACCEPTED, SamplingParams
    params = SamplingParams()
    params.temperature = 0.0
    params.ignore_eos = True
    text = " ".join(f"item {i} costs {i * 7 % 100} coins;" for i in range(tokens))
    prompt = engine.tokenize(text, False, True)[:tokens]
    start = time.perf_counter()
    assert engine.submit(99_999, prompt, generate, [], params) == SUBMIT_ACCEPTED
    first = None
    while True:
        select.select([engine.fileno()], [], [])
        now = time.perf_counter()
        for event in engine.take_events():
            first = first or now
            if event.status != STATUS_RUNNING:
                return tokens / (first - start), (generate - 1) / (now - first)


# The steps on ggml's per-row paths, as stackd_kernels_batch_invariant numbers them
# (accel.NO_STEPS, DECODE_STEPS, ALL_STEPS), by the column each heads.
MODES = {"ggml's paths": 0, "default (decode steps)": 1, "batch_invariant": 2}


def child(steps: int, threads: int, model: str | None) -> None:
    from stackd.engine import accel
    accel.register("auto")
    accel.library().stackd_kernels_batch_invariant(steps)
    from stackd.engine.core import Engine
    engine = Engine(model_path(model), slots=max(STREAMS), context_length=LONG_PROMPT_TOKENS + 128,
                    batch=512, threads=threads, flash_attn=1)
    run_streams(engine, 2, 1)  # warm up
    prefill_long, decode_long = long_prompt_alone(engine, LONG_PROMPT_TOKENS)
    out = {"prefill_long": prefill_long, "decode_long": decode_long}
    for i, n in enumerate(STREAMS):
        out[str(n)] = run_streams(engine, n, 1000 * (i + 1))
    engine.close()
    print(json.dumps(out))


def measure(steps: int, threads: int, model: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", str(steps), "--threads", str(threads)]
    out = subprocess.run(cmd + (["--model", model] if model else []), check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.threads, args.model)
    rows = {f"prefill, {LONG_PROMPT_TOKENS}-token prompt alone": lambda r: r["prefill_long"],
            "decode, 1 stream after it": lambda r: r["decode_long"],
            **{f"decode, {n} streams": (lambda r, n=n: r[str(n)]["decode"]) for n in STREAMS},
            f"prefill, {STREAMS[-1]} x 32-token prompts": lambda r: r[str(STREAMS[-1])]["prefill"]}
    modes = list(MODES.items())
    ratios = {(name, label): [] for name in rows for label, _ in modes[1:]}
    print(f"{cpu_name()}; {os.path.basename(model_path(args.model))}; {args.threads} threads", flush=True)
    for r in range(args.rounds):
        runs = {label: measure(steps, args.threads, args.model) for label, steps in modes}
        base = runs[modes[0][0]]
        for name, get in rows.items():
            for label, _ in modes[1:]:
                ratios[(name, label)].append(get(runs[label]) / get(base))
        print(f"round {r + 1}: " + "; ".join(
            f"{name} " + " / ".join(f"{get(runs[label]):.1f}" for label, _ in modes) + " tok/s"
            for name, get in rows.items()), flush=True)
    print(f"tok/s in the order {' / '.join(MODES)}; ratios against ggml's paths everywhere, "
          f"{args.rounds} alternating rounds, medians (min-max)")
    print("| | " + " | ".join(label for label, _ in modes[1:]) + " |\n|---|" + "---|" * (len(modes) - 1))
    for name in rows:
        print(f"| {name} | " + " | ".join(
            f"{median(ratios[(name, label)]):.2f}x ({min(ratios[(name, label)]):.2f}-{max(ratios[(name, label)]):.2f})"
            for label, _ in modes[1:]) + " |")


if __name__ == "__main__":
    main()
