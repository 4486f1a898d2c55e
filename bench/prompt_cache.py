"""The prompt cache on disk (docs/engine.md, "Prompt cache on disk"): the time to first token
of a conversation's follow-up turn over a ~2,000-token system prompt, on the real daemon and the
default chat model, three ways in one run:

- restored: the first turn answered, the daemon stopped and started again on the same data dir,
  then the follow-up (its first turn's KV comes from the file);
- warm: the first turn answered, then a follow-up on the same daemon (the KV in a slot);
- cold: the same follow-up on a daemon without the cache (models.prompt_cache_mb = 0).

    .venv/bin/python bench/prompt_cache.py [--rounds 3] [--devices 150]

Each round has its own system prompt (nothing carries over from the round before); the warm and
the restored follow-ups ask different questions, so the restored one finds only the first turn
on disk, not itself. Medians over the rounds; streamed requests, the first token timed from the
request's send.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from testing.daemon import Daemon  # noqa: E402

CHAT = "smollm2-135m-instruct"
CONFIG = ("[rate_limits]\ninference = 0\n[engine]\nslots = 4\ncontext_length = 4096\n"
          "[models]\npreload = [\"smollm2-135m-instruct\"]\n")
ROOMS = ["kitchen", "hall", "bedroom", "garage", "office", "garden", "attic", "cellar"]


def system_prompt(n_devices: int, seed: int) -> str:
    lines = [f"- {ROOMS[(i + seed) % len(ROOMS)]}.light_{i}_{seed}: state {'on' if (i + seed) % 3 else 'off'}, "
             f"brightness {(i * 37 + seed) % 100}%, last changed {(i * 13 + seed) % 60} minutes ago"
             for i in range(n_devices)]
    return ("You are a voice assistant for a smart home. Answer briefly. The devices and their "
            "states:\n" + "\n".join(lines))


def ttft(daemon: Daemon, messages: list[dict]) -> tuple[float, str, int]:
    """-> (seconds to the first content chunk, the answer, cached prompt tokens)."""
    client = daemon.openai_client()
    t0 = time.perf_counter()
    first = None
    text = []
    cached = 0
    stream = client.chat.completions.create(model=CHAT, messages=messages, temperature=0, max_tokens=16,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    return first if first is not None else time.perf_counter() - t0, "".join(text), cached


def kv_files(data: str) -> int:
    return len(glob.glob(os.path.join(data, "models", "kv", "*", "*.kv")))


def wait_for_files(data: str, n: int) -> None:
    deadline = time.monotonic() + 120
    while kv_files(data) < n:
        if time.monotonic() > deadline:
            raise SystemExit("the first turn's file was never written")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices", type=int, default=150, help="system prompt lines (~13 tokens each)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-prompt-cache-")
    data, cold_data = os.path.join(work, "data"), os.path.join(work, "cold")
    rows = {"restored": [], "warm": [], "cold": []}
    prompt_tokens = []
    for r in range(args.rounds):
        system = system_prompt(args.devices, r)
        first_turn = [{"role": "system", "content": system}, {"role": "user", "content": "Is the kitchen light on?"}]
        daemon = Daemon(data, CONFIG, models=True)
        try:
            before = kv_files(data)
            _, answer, _ = ttft(daemon, first_turn)
            history = first_turn + [{"role": "assistant", "content": answer}]
            wait_for_files(data, before + 1)
            warm, _, cached_warm = ttft(daemon, history + [{"role": "user", "content": "And the garage?"}])
        finally:
            daemon.stop()
        follow_up = history + [{"role": "user", "content": "Which lights in the office are off?"}]
        daemon = Daemon(data, CONFIG, models=True)
        try:
            restored, restored_text, cached_restored = ttft(daemon, follow_up)
            status, _, usage = daemon.request("POST", "/v1/chat/completions", port="inference",
                                              key=daemon.admin_key, body={"model": CHAT, "messages": follow_up,
                                                                          "max_tokens": 1, "temperature": 0})
            prompt_tokens.append(usage["usage"]["prompt_tokens"])
        finally:
            daemon.stop()
        cold_daemon = Daemon(os.path.join(cold_data, str(r)), CONFIG + "prompt_cache_mb = 0\n", models=True)
        try:
            cold, cold_text, cached_cold = ttft(cold_daemon, follow_up)
        finally:
            cold_daemon.stop()
        assert cached_cold == 0 and cached_restored > 0 and cached_warm > 0, (cached_cold, cached_restored, cached_warm)
        assert restored_text == cold_text, (restored_text, cold_text)     # greedy: the same answer
        rows["restored"].append(restored)
        rows["warm"].append(warm)
        rows["cold"].append(cold)
        print(f"round {r + 1}: restored {restored * 1000:.0f} ms (cached {cached_restored}), "
              f"warm {warm * 1000:.0f} ms (cached {cached_warm}), cold {cold * 1000:.0f} ms", flush=True)
    median = {name: statistics.median(values) for name, values in rows.items()}
    print(json.dumps({"prompt_tokens": prompt_tokens, "ttft_ms": {k: round(v * 1000) for k, v in median.items()},
                      "restored_over_warm": round(median["restored"] / median["warm"], 2),
                      "restored_over_cold": round(median["restored"] / median["cold"], 3)}))


if __name__ == "__main__":
    main()
