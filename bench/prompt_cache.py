"""The prompt cache on disk (docs/engine.md, "Prompt cache on disk"): the time to first token
of a conversation's follow-up turn over a ~2,000-token system prompt, on the real daemon and the
default chat model, in one run:

- restored: the first turn answered, the daemon stopped and started again on the same data dir,
  then the follow-up (its first turn's KV comes from the file, put back into a slot by the
  model's load: models.prompt_cache_preload, the default);
- restored at admission: the same with models.prompt_cache_preload = 0 (the file found and read
  when the follow-up is admitted);
- warm: the first turn answered, then a follow-up on the same daemon (the KV in a slot);
- restored on a primed engine: the same follow-up on a daemon started again whose engine
  answered one short request first (the restore apart from a new worker's first step);
- cold: the same follow-up on a daemon without the cache (models.prompt_cache_mb = 0).

The engine's own restore time (lookup, read, check, into the sequence) and the model's load time
(which a preload lengthens) come from /metrics.

    .venv/bin/python bench/prompt_cache.py [--rounds 3] [--devices 150] [--peer]

--peer adds llama-server's best case on the same file and threads: --slot-save-path, the slot
saved and, after a restart, restored by explicit calls (/slots/0?action=save|restore) before the
follow-up; its restored time counts the restore call, which a client waits for.

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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


def peer_ttft(port: int, messages: list[dict]) -> tuple[float, str]:
    """llama-server's streamed chat on slot 0 -> (seconds to the first content chunk, the answer)."""
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    first, text = None, []
    for chunk in client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=16,
                                                stream=True, extra_body={"id_slot": 0, "cache_prompt": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
    return first if first is not None else time.perf_counter() - t0, "".join(text)


def slot_action(port: int, action: str, filename: str) -> float:
    """POST /slots/0?action=save|restore -> the seconds the call took."""
    import http.client
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", f"/slots/0?action={action}", json.dumps({"filename": filename}).encode(),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = response.read()
    if response.status != 200:
        raise SystemExit(f"llama-server /slots/0?action={action}: {response.status} {answer[:200]!r}")
    return time.perf_counter() - t0


def peer_round(system: str, save_dir: str, r: int) -> dict:
    """llama-server's best case with --slot-save-path: the first turn on slot 0, the slot saved by
    an explicit call, the server started again, the slot restored by an explicit call, then the
    follow-up on slot 0; warm and cold as ours. -> seconds per way (restored counts its restore
    call: what a client waits for)."""
    import inference
    import peers
    binary = peers.llama_server()

    def start(*extra: str):
        return inference.start_llama_server(binary, 4, 4096, 2, extra=extra)

    first_turn = [{"role": "system", "content": system}, {"role": "user", "content": "Is the kitchen light on?"}]
    os.makedirs(save_dir, exist_ok=True)
    server = start("--slot-save-path", save_dir)
    try:
        _, answer = peer_ttft(server.port, first_turn)
        history = first_turn + [{"role": "assistant", "content": answer}]
        warm, _ = peer_ttft(server.port, history + [{"role": "user", "content": "And the garage?"}])
        slot_action(server.port, "save", f"round{r}.bin")
    finally:
        server.stop()
    follow_up = history + [{"role": "user", "content": "Which lights in the office are off?"}]
    server = start("--slot-save-path", save_dir)
    try:
        restore = slot_action(server.port, "restore", f"round{r}.bin")
        restored, _ = peer_ttft(server.port, follow_up)
    finally:
        server.stop()
    server = start()
    try:
        cold, _ = peer_ttft(server.port, follow_up)
    finally:
        server.stop()
    print(f"llama-server round {r + 1}: restored {(restore + restored) * 1000:.0f} ms (its restore call "
          f"{restore * 1000:.0f} ms), warm {warm * 1000:.0f} ms, cold {cold * 1000:.0f} ms", flush=True)
    return {"restored": restore + restored, "warm": warm, "cold": cold}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices", type=int, default=150, help="system prompt lines (~13 tokens each)")
    parser.add_argument("--peer", action="store_true",
                        help="also llama-server with --slot-save-path and explicit save and restore calls")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-prompt-cache-")
    data, cold_data = os.path.join(work, "data"), os.path.join(work, "cold")
    rows = {"restored": [], "restored_at_admission": [], "restored_primed": [], "warm": [], "cold": []}
    restore_ms, admission_restore_ms, load_ms, admission_load_ms = [], [], [], []
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
            restore_ms.append(daemon.metric("stackd_prompt_cache_restore_us_total") / 1000)
            load_ms.append(daemon.metric("stackd_model_load_seconds_total") * 1000)
            assert daemon.metric("stackd_prompt_cache_preloads_total") >= 1
            status, _, usage = daemon.request("POST", "/v1/chat/completions", port="inference",
                                              key=daemon.admin_key, body={"model": CHAT, "messages": follow_up,
                                                                          "max_tokens": 1, "temperature": 0})
            prompt_tokens.append(usage["usage"]["prompt_tokens"])
        finally:
            daemon.stop()
        daemon = Daemon(data, CONFIG + "prompt_cache_preload = 0\n", models=True)
        try:
            at_admission, admission_text, cached_admission = ttft(daemon, follow_up)
            admission_restore_ms.append(daemon.metric("stackd_prompt_cache_restore_us_total") / 1000)
            admission_load_ms.append(daemon.metric("stackd_model_load_seconds_total") * 1000)
            assert daemon.metric("stackd_prompt_cache_hits_total") == 1
            assert admission_text == restored_text, (admission_text, restored_text)
        finally:
            daemon.stop()
        # The same restore on a restarted daemon whose engine has run one short request first:
        # what the file costs apart from a new worker's first step (its pages, its threads).
        daemon = Daemon(data, CONFIG, models=True)
        try:
            ttft(daemon, [{"role": "user", "content": "Hello"}])
            primed, primed_text, cached_primed = ttft(daemon, follow_up)     # the same work as restored's
            assert primed_text == restored_text, (primed_text, restored_text)
        finally:
            daemon.stop()
        cold_daemon = Daemon(os.path.join(cold_data, str(r)), CONFIG + "prompt_cache_mb = 0\n", models=True)
        try:
            cold, cold_text, cached_cold = ttft(cold_daemon, follow_up)
        finally:
            cold_daemon.stop()
        assert cached_cold == 0 and min(cached_restored, cached_admission, cached_warm, cached_primed) > 0, \
            (cached_cold, cached_restored, cached_admission, cached_warm, cached_primed)
        assert restored_text == cold_text, (restored_text, cold_text)     # greedy: the same answer
        rows["restored"].append(restored)
        rows["restored_at_admission"].append(at_admission)
        rows["warm"].append(warm)
        rows["restored_primed"].append(primed)
        rows["cold"].append(cold)
        print(f"round {r + 1}: restored {restored * 1000:.0f} ms (cached {cached_restored}, preloaded by the "
              f"load in {restore_ms[-1]:.0f} ms, load {load_ms[-1]:.0f} ms), restored at admission "
              f"{at_admission * 1000:.0f} ms (the engine's restore {admission_restore_ms[-1]:.0f} ms, load "
              f"{admission_load_ms[-1]:.0f} ms), restored on a primed engine {primed * 1000:.0f} ms, "
              f"warm {warm * 1000:.0f} ms (cached {cached_warm}), cold {cold * 1000:.0f} ms", flush=True)
    peer_rows = {"restored": [], "warm": [], "cold": []}
    if args.peer:
        for r in range(args.rounds):
            for name, value in peer_round(system_prompt(args.devices, r), os.path.join(work, "slots"), r).items():
                peer_rows[name].append(value)
    median = {name: statistics.median(values) for name, values in rows.items()}
    peer = {name: round(statistics.median(values) * 1000) for name, values in peer_rows.items() if values}
    print(json.dumps({"prompt_tokens": prompt_tokens, "ttft_ms": {k: round(v * 1000) for k, v in median.items()},
                      "preload_ms": round(statistics.median(restore_ms)),
                      "admission_restore_ms": round(statistics.median(admission_restore_ms)),
                      "load_ms": {"preloading": round(statistics.median(load_ms)),
                                  "not_preloading": round(statistics.median(admission_load_ms))},
                      "restored_over_warm": round(median["restored"] / median["warm"], 2),
                      "at_admission_over_warm": round(median["restored_at_admission"] / median["warm"], 2),
                      "primed_over_warm": round(median["restored_primed"] / median["warm"], 2),
                      "restored_over_cold": round(median["restored"] / median["cold"], 3),
                      **({"llama_server_ttft_ms": peer,
                          "restored_over_llama_server_restored": round(median["restored"] * 1000 / peer["restored"], 2)}
                         if peer else {})}))


if __name__ == "__main__":
    main()
