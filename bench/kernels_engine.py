"""Engine level (no HTTP, no sampling cost to speak of): decode and prefill tokens/s with our
kernels on and off, and llama.cpp's own llama-batched-bench on the same model, side by side.

Same model file (the default SmolLM2-135M Q4_1), threads, 32-token prompts, 128 generated
tokens per sequence, 1/16/32 parallel sequences, flash attention on. Each stackd mode runs in
its own process (kernel registration is per process). For stackd, prefill tok/s is the prompt
tokens over the time to every stream's first token, decode tok/s the remaining tokens over the
time from there to the last one; llama-batched-bench reports the same split (S_PP, S_TG).

    .venv/bin/python bench/kernels_engine.py [--threads 2] [--streams 1,16,32]
    .venv/bin/python bench/kernels_engine.py --rounds 5    # kernels on vs the peer, alternating
    .venv/bin/python bench/kernels_engine.py --rounds 5 --model "$(.venv/bin/python -m testing.quantized_model)"
    .venv/bin/python bench/kernels_engine.py --rounds 5 --kernels avx2   # force a path (engine.kernels)
    .venv/bin/python bench/kernels_engine.py --rounds 5 --attention ggml # our matmuls, ggml's attention
    .venv/bin/python bench/kernels_engine.py --rounds 5 --cpu avx2       # both sides as an AVX2-only CPU
    .venv/bin/python bench/kernels_engine.py --rounds 5 --chunked-ab     # the chunked form on / off

--model runs another GGUF on both sides (a Q4_K_M file: the K-quant kernels); --kernels forces
one of our code paths (avx2 on an AVX-512 machine measures what an AVX2-only CPU would run,
at this machine's clocks and caches); --attention ggml leaves decode attention to ggml in the
kernels-on runs (kernels/README.md, "Decode attention"): the A/B of that kernel alone. `--cpu
avx2` runs an AVX2-only CPU's code on both sides of an AVX-512 machine: the peer and our
engine's ggml from llama.cpp built with AVX-512 off (peers.avx2_tree), our kernels on their
AVX2 path. The CPU's name heads the output.

One stream decodes 127 tokens in about a second, and this machine's speed drifts by tens of
percent from one second to the next: one run can land stackd and the peer in different
phases. `--rounds N` runs the two one after the other N times and reports each round's ratios
and their medians.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPT_TOKENS, GEN_TOKENS = 32, 128


def run_streams(engine, n: int, first_id: int) -> dict:
    from stackd.engine.core import STATUS_RUNNING, SUBMIT_ACCEPTED, SamplingParams
    params = SamplingParams()
    params.temperature = 0.0
    params.ignore_eos = True
    prompt = engine.tokenize("Once upon a time, in a small village at the edge of a great forest, "
                             "there lived a curious young girl who loved to explore every single "
                             "path and hill", False, True)[:PROMPT_TOKENS]
    assert len(prompt) == PROMPT_TOKENS
    ids = list(range(first_id, first_id + n))
    start = time.perf_counter()
    for rid in ids:
        assert engine.submit(rid, prompt, GEN_TOKENS, [], params) == SUBMIT_ACCEPTED
    first, pending, last = {}, set(ids), start
    while pending:
        select.select([engine.fileno()], [], [])
        now = time.perf_counter()
        for event in engine.take_events():
            first.setdefault(event.id_request, now)
            if event.status != STATUS_RUNNING:
                pending.discard(event.id_request)
                last = now
    all_first = max(first.values())
    return {"prefill": n * PROMPT_TOKENS / (all_first - start),
            "decode": n * (GEN_TOKENS - 1) / (last - all_first)}


def model_path(model: str | None) -> str:
    from stackd.store import defaults
    return model or defaults.smollm2_path()


def cpu_name() -> str:
    """The CPU's name, as the figures name it: x86's /proc/cpuinfo "model name"; an ARM kernel's
    cpuinfo has none (only part numbers), so there lscpu's, which decodes them (Cortex-A76,
    Neoverse-N1), with the feature flags our paths choose by."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        name = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
        features = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("Features")), [])
        return f"{name} ({', '.join(f for f in ('asimddp', 'i8mm', 'sve') if f in features) or 'no dotprod'})"
    except (OSError, subprocess.SubprocessError, StopIteration):
        return "unknown CPU"


def child(mode: str, streams: list[int], threads: int, model: str | None, attention: str,
          chunked: str = "on") -> None:
    from stackd.engine import accel
    accel.commit_on_write()          # the KV cache as the product commits it (engine.kv_commit)
    path = accel.register(mode)
    if path is not None:
        accel.set_attention(attention == "ours")
        accel.set_chunked(chunked == "on")
    from stackd.engine.core import Engine
    engine = Engine(model_path(model), slots=max(streams), context_length=256, batch=512,
                    threads=threads, flash_attn=1)
    run_streams(engine, 2, 1)  # warm up
    out = {"path": path, "tensors": accel.tensors()}
    for i, n in enumerate(streams):
        out[n] = run_streams(engine, n, 1000 * (i + 1))
    engine.close()
    print(json.dumps(out))


# --cpu avx2: the environment of our children and the folder of the peer's binary
CHILD_ENV: dict = {}
PEER_DIR: str | None = None


def use_avx2_build() -> None:
    global CHILD_ENV, PEER_DIR
    import peers
    CHILD_ENV = peers.avx2_env()
    PEER_DIR = peers.avx2_tree()


def stackd(mode: str, streams: list[int], threads: int, model: str | None = None, attention: str = "ours",
           chunked: str = "on") -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--threads", str(threads),
                          "--streams", ",".join(map(str, streams)), "--attention", attention,
                          "--chunked", chunked] +
                         (["--model", model] if model else []),
                         check=True, capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, **CHILD_ENV}).stdout
    return {int(k) if k.isdigit() else k: v for k, v in json.loads(out.splitlines()[-1]).items()}


def batched_bench_binary() -> str:
    """llama-batched-bench: --cpu avx2's build when chosen, else the native one."""
    import peers
    return os.path.join(PEER_DIR, "llama-batched-bench") if PEER_DIR else peers.llama_batched_bench()


def batched_bench(streams: list[int], threads: int, model: str | None = None) -> dict:
    ctx = max(streams) * (PROMPT_TOKENS + GEN_TOKENS) + 64
    out = subprocess.run([batched_bench_binary(), "-m", model_path(model), "-c", str(ctx),
                          "-b", "512", "-ub", "512", "-npp", str(PROMPT_TOKENS), "-ntg",
                          str(GEN_TOKENS), "-npl", ",".join(map(str, streams)), "-t", str(threads),
                          "-fa", "on"], check=True, capture_output=True, text=True).stdout
    result = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and re.fullmatch(r"\d+", cells[0]):
            result[int(cells[2])] = {"prefill": float(cells[5]), "decode": float(cells[7])}
    return result


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def print_ratios(ratios: dict[str, list[float]], digits: int = 2) -> None:
    """Each row's median, min and max over the rounds, as a markdown table."""
    print("| | median | min | max |\n|---|---|---|---|")
    for name, values in ratios.items():
        print(f"| {name} | {median(values):.{digits}f}x | {min(values):.{digits}f}x | {max(values):.{digits}f}x |")


def alternate(rounds: int, streams: list[int], threads: int, model: str | None, mode: str, attention: str) -> None:
    """Kernels on against llama-batched-bench, one after the other, `rounds` times."""
    pre = streams[1] if len(streams) > 1 else streams[0]
    ratios: dict[str, list[float]] = {**{f"decode ({n})": [] for n in streams}, f"prefill ({pre})": []}
    for r in range(rounds):
        ours, peer = stackd(mode, streams, threads, model, attention), batched_bench(streams, threads, model)
        for n in streams:
            ratios[f"decode ({n})"].append(ours[n]["decode"] / peer[n]["decode"])
        ratios[f"prefill ({pre})"].append(ours[pre]["prefill"] / peer[pre]["prefill"])
        if r == 0:
            print(f"{cpu_name()}{' (AVX2-only builds)' if PEER_DIR else ''}; {os.path.basename(model_path(model))}; weights on our kernels: {ours['tensors']}; "
                  f"decode attention: {attention}")
        print(f"round {r + 1} ({ours['path']}): " + ", ".join(
            f"{n} streams {ours[n]['decode']:.1f} / {peer[n]['decode']:.1f} tok/s" for n in streams), flush=True)
    print(f"{threads} threads, {PROMPT_TOKENS}-token prompts, {GEN_TOKENS} generated, flash attention on; "
          f"stackd (kernels on) / llama-batched-bench over {rounds} alternating rounds")
    print_ratios(ratios)


def chunked_ab(rounds: int, streams: list[int], threads: int, model: str | None, mode: str) -> None:
    """The chunked form (what a tensor split cuts: attn_output, ffn_down) on against off, one
    after the other, `rounds` times: what one node pays so that a split answers as it does."""
    ratios: dict[str, list[float]] = {f"decode ({n})": [] for n in streams}
    for r in range(rounds):
        on, off = stackd(mode, streams, threads, model, chunked="on"), stackd(mode, streams, threads, model, chunked="off")
        for n in streams:
            ratios[f"decode ({n})"].append(on[n]["decode"] / off[n]["decode"])
        print(f"round {r + 1} ({on['path']}): " + ", ".join(
            f"{n} streams {on[n]['decode']:.1f} / {off[n]['decode']:.1f} tok/s" for n in streams), flush=True)
    print(f"{cpu_name()}; {os.path.basename(model_path(model))}; {threads} threads; "
          f"chunked form on / off over {rounds} alternating rounds")
    print_ratios(ratios, digits=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--streams", default="1,16,32")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-peer", action="store_true", help="skip llama-batched-bench")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default chat model)")
    parser.add_argument("--kernels", default="auto", help="engine.kernels for the kernels-on runs (auto, avx2, ...)")
    parser.add_argument("--attention", choices=["ours", "ggml"], default="ours",
                        help="decode attention in the kernels-on runs (default: ours)")
    parser.add_argument("--cpu", choices=["native", "avx2"], default="native",
                        help="avx2: both sides run an AVX2-only CPU's code (llama.cpp built without "
                             "AVX-512, our kernels' AVX2 path)")
    parser.add_argument("--chunked", choices=["on", "off"], default="on",
                        help="the chunked form of the products a tensor split cuts (kernels/README.md)")
    parser.add_argument("--chunked-ab", action="store_true",
                        help="with --rounds: the chunked form on against off instead of against the peer")
    parser.add_argument("--rounds", type=int, default=0,
                        help="kernels on against the peer, alternating N times (medians of the ratios)")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    if args.child:
        return child(args.child, streams, args.threads, args.model, args.attention, args.chunked)
    if args.cpu == "avx2":
        use_avx2_build()
        args.kernels = "avx2"
    if args.rounds and args.chunked_ab:
        return chunked_ab(args.rounds, streams, args.threads, args.model, args.kernels)
    if args.rounds:
        return alternate(args.rounds, streams, args.threads, args.model, args.kernels, args.attention)
    runs = {"stackd, kernels off": stackd("off", streams, args.threads, args.model)}
    on = stackd(args.kernels, streams, args.threads, args.model, args.attention)
    tensors = on.pop("tensors")
    runs[f"stackd, kernels on ({on.pop('path')})"] = on
    runs["stackd, kernels off"].pop("path")
    runs["stackd, kernels off"].pop("tensors")
    if not args.no_peer:
        runs["llama-batched-bench"] = batched_bench(streams, args.threads, args.model)
    print(f"{cpu_name()}; {os.path.basename(model_path(args.model))}; weights on our kernels: {tensors}")
    print(f"{args.threads} threads, {PROMPT_TOKENS}-token prompts, {GEN_TOKENS} generated, flash attention on")
    print("| run | " + " | ".join(f"decode tok/s ({n})" for n in streams) +
          f" | prefill tok/s ({streams[-1] if len(streams) < 2 else streams[1]}) |")
    print("|---|" + "---|" * (len(streams) + 1))
    pre = streams[1] if len(streams) > 1 else streams[0]
    for name, r in runs.items():
        print(f"| {name} | " + " | ".join(f"{r[n]['decode']:.1f}" for n in streams) +
              f" | {r[pre]['prefill']:.1f} |")


if __name__ == "__main__":
    main()
