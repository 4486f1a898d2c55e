"""The KV cache's type (engine.kv_type): f16 against q8_0 on the default chat model, at engine
level. Memory: the KV cache's bytes (llama.cpp's own buffer, as the planner estimates it) and
the process's PSS with the model loaded and 16 streams decoded; speed: decode tokens/s at 16
streams (bench/kernels_engine.py's workload: 32-token prompts, 128 generated); quality: greedy
answers of q8_0 against f16 over a set of chat prompts (identical answers, and the share of each
f16 answer that q8_0 reproduces before it first differs).

    .venv/bin/python bench/kv_type.py [--rounds 3] [--context 1024] [--prompts 32]

Each round runs f16 then q8_0 (then q8_0 first in the next round), each in a process of its
own so that PSS is that engine's alone; medians over the rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STREAMS = 16
QUESTIONS = ["What is the capital of France?", "Name three colors.", "Count from one to five.",
             "What is 2 + 2?", "Say hello in Spanish.", "What do bees make?", "Name a planet.",
             "What is ice made of?", "Why is the sky blue?", "Write a haiku about rain.",
             "What is the largest ocean?", "Give me a synonym for happy.",
             "How many legs does a spider have?", "What is photosynthesis?",
             "Translate 'thank you' into French.", "Name two fruits that are red.",
             "Explain gravity to a child.", "What is a prime number?", "List the days of the week.",
             "Who wrote Romeo and Juliet?", "What is the boiling point of water?",
             "Describe a cat in one sentence.", "What is the opposite of cold?",
             "Give a tip for sleeping well.", "What does a compiler do?", "Name a famous painter.",
             "How do plants drink water?", "What is the speed of light?",
             "Write a short greeting for a birthday card.", "What is the tallest mountain?",
             "Summarize the water cycle.", "What is an atom?"]


def pss_bytes() -> int:
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def engine_of(kv_type: str, context: int, slots: int):
    from stackd.engine import accel
    accel.register("auto")
    from stackd.engine.config import KV_TYPES
    from stackd.engine.core import Engine
    from stackd.store import defaults
    return Engine(defaults.smollm2_path(), slots=slots, context_length=context, batch=512,
                  threads=os.cpu_count() or 2, kv_type=KV_TYPES[kv_type])


def speed_child(kv_type: str, context: int) -> dict:
    from kernels_engine import run_streams
    before = pss_bytes()
    engine = engine_of(kv_type, context, STREAMS)
    run_streams(engine, 2, 1)                                    # warm up
    decode = run_streams(engine, STREAMS, 100)["decode"]
    out = {"decode": decode, "pss_mb": (pss_bytes() - before) / 2**20}
    engine.close()
    return out


def greedy(engine, prompts: list[list[int]], max_tokens: int) -> list[bytes]:
    import select
    from stackd.engine.core import STATUS_RUNNING, SamplingParams
    params = SamplingParams()
    params.temperature = 0.0
    texts = {i: b"" for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        engine.submit(i, prompt, max_tokens, [], params)
    pending = set(texts)
    while pending:
        select.select([engine.fileno()], [], [])
        for event in engine.take_events():
            texts[event.id_request] += event.text
            if event.status != STATUS_RUNNING:
                pending.discard(event.id_request)
    return [texts[i] for i in range(len(prompts))]


def quality_child(n_prompts: int, max_tokens: int) -> dict:
    answers = {}
    for kv_type in ("f16", "q8_0"):
        engine = engine_of(kv_type, 512, STREAMS)
        prompts = [engine.tokenize(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n", False, True)
                   for q in QUESTIONS[:n_prompts]]
        answers[kv_type] = greedy(engine, prompts, max_tokens)
        engine.close()
    same, shared = 0, []
    for a, b in zip(answers["f16"], answers["q8_0"]):
        same += a == b
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shared.append(n / max(1, len(a)))
    return {"prompts": len(shared), "identical": same, "mean_shared_prefix": sum(shared) / len(shared)}


def run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True,
                         text=True, cwd=ROOT).stdout
    return json.loads(out.splitlines()[-1])


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=1024, help="tokens per slot (16 slots)")
    parser.add_argument("--prompts", type=int, default=len(QUESTIONS))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        result = speed_child(rest[0], int(rest[1])) if kind == "speed" else quality_child(int(rest[0]), int(rest[1]))
        print(json.dumps(result))
        return
    from stackd.engine.config import kv_bytes
    per_token = 2 * 30 * 192                     # SmolLM2-135M: K and V, 30 layers, 192 values each
    runs = {"f16": [], "q8_0": []}
    for r in range(args.rounds):
        order = ("f16", "q8_0") if r % 2 == 0 else ("q8_0", "f16")
        for kv_type in order:
            runs[kv_type].append(run_child("speed", kv_type, str(args.context)))
        print(f"round {r + 1}: " + ", ".join(f"{t} {runs[t][-1]['decode']:.1f} tok/s, PSS +{runs[t][-1]['pss_mb']:.0f} MB"
                                             for t in ("f16", "q8_0")), flush=True)
    print(f"\n{STREAMS} streams, context {args.context} a slot, medians of {args.rounds} alternating rounds")
    print("| kv_type | KV cache | process PSS (model + KV + buffers) | decode tok/s at 16 streams |\n|---|---|---|---|")
    for kv_type, values in runs.items():
        kv = STREAMS * args.context * per_token // 192 * kv_bytes(192, kv_type) // 2**20
        print(f"| {kv_type} | {kv} MiB | {median([v['pss_mb'] for v in values]):.0f} MB "
              f"| {median([v['decode'] for v in values]):.1f} |")
    ratio = median([q["decode"] / f["decode"] for q, f in zip(runs["q8_0"], runs["f16"])])
    print(f"q8_0 / f16 decode: {ratio:.3f}x (median of per-round ratios)")
    quality = run_child("quality", str(args.prompts), str(args.max_tokens))
    print(f"greedy, {args.max_tokens} tokens: {quality['identical']} of {quality['prompts']} answers identical; "
          f"mean share of the f16 answer reproduced before the first difference {quality['mean_shared_prefix']:.3f}")


if __name__ == "__main__":
    main()
