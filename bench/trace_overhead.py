"""What the engine trace costs: tokens/s with tracing compiled out, compiled in but off, and on.

The same engine (SmolLM2-135M, 16 slots of 512 tokens) decodes 16 greedy requests of 128
tokens each (end of generation suppressed) in three builds/modes, each in its own process,
alternating for --rounds rounds; medians. "compiled out" is this checkout's engine rebuilt
with -DSTACKD_TRACE=OFF into a temporary directory (the hooks' flag check compiled away).
Targets (issue 12): off >= 0.99x compiled out, on >= 0.95x compiled out.

    .venv/bin/python bench/trace_overhead.py [--rounds 7] [--tokens 128]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_without_trace(out_dir: str) -> str:
    import pybind11
    build_dir = os.path.join(out_dir, "build")
    subprocess.check_call(["cmake", ROOT, "-B", build_dir, f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
                           f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                           "-DCMAKE_BUILD_TYPE=Release", "-DSTACKD_TRACE=OFF"], stdout=subprocess.DEVNULL)
    subprocess.check_call(["cmake", "--build", build_dir, "--parallel", str(os.cpu_count() or 2)],
                          stdout=subprocess.DEVNULL)
    [module] = glob.glob(os.path.join(out_dir, "_engine*.so"))
    return module


def worker(module: str | None, trace_on: bool, n_tokens: int, n_requests: int, threads: int) -> None:
    """One measurement in this process: print {"tok_s": ...}."""
    import llama_cpp  # noqa: F401  (load order: see server/engine/__init__.py)
    import stackd
    if module:                                   # the compiled-out build stands in for stackd._engine
        import importlib.util
        spec = importlib.util.spec_from_file_location("stackd._engine", module)
        native = importlib.util.module_from_spec(spec)
        sys.modules["stackd._engine"] = native
        spec.loader.exec_module(native)
        stackd._engine = native
    import select
    from stackd.engine.core import STATUS_RUNNING, Engine, SamplingParams
    from stackd.store import defaults

    engine = Engine(defaults.smollm2_path(), slots=n_requests, context_length=512, threads=threads)
    sampling = SamplingParams()
    sampling.temperature = 0.0
    sampling.ignore_eos = True
    prompt = engine.tokenize("Write a long story about a lighthouse keeper.", True, False)

    def run(first_id: int, max_tokens: int) -> int:
        for i in range(n_requests):
            assert engine.submit(first_id + i, prompt, max_tokens, [], sampling) == 0
        open_ids, n = n_requests, 0
        while open_ids:
            select.select([engine.fileno()], [], [])
            for event in engine.take_events():
                n += event.n_tokens
                open_ids -= event.status != STATUS_RUNNING
        return n

    run(1, 4)                                    # warm up
    if trace_on:
        engine.trace_start()
    began = time.perf_counter()
    n = run(1000, n_tokens)
    elapsed = time.perf_counter() - began
    if trace_on:
        engine.trace_stop()
    engine.close()
    print(json.dumps({"tok_s": n / elapsed}))


def measure(module: str | None, trace_on: bool, args) -> float:
    command = [sys.executable, __file__, "--worker", "--tokens", str(args.tokens),
               "--threads", str(args.threads)] + (["--module", module] if module else []) + \
              (["--trace-on"] if trace_on else [])
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--module", help=argparse.SUPPRESS)
    parser.add_argument("--trace-on", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.module, args.trace_on, args.tokens, 16, args.threads)
        return
    with tempfile.TemporaryDirectory(prefix="stackd-notrace-") as tmp:
        print("building the engine with tracing compiled out...", flush=True)
        without = build_without_trace(tmp)
        modes = {"compiled out": (without, False), "compiled in, off": (None, False),
                 "compiled in, on": (None, True)}
        results: dict[str, list[float]] = {name: [] for name in modes}
        for r in range(args.rounds):
            for name, (module, trace_on) in modes.items():
                results[name].append(measure(module, trace_on, args))
                print(f"round {r + 1} {name}: {results[name][-1]:.1f} tok/s", flush=True)
    # The machine's speed drifts between rounds by more than the effect measured (a round's
    # three runs sit side by side), so each round's ratio is taken first, then their median.
    base = results["compiled out"]
    print("\n| build / mode | tokens/s (median) | ratio to compiled out (median of rounds) | "
          "rounds' ratios |\n|---|---|---|---|")
    for name, values in results.items():
        ratios = [v / b for v, b in zip(values, base)]
        print(f"| {name} | {statistics.median(values):.1f} | {statistics.median(ratios):.3f}x | "
              f"{min(ratios):.3f}-{max(ratios):.3f} |")


if __name__ == "__main__":
    main()
