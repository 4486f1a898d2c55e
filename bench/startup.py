"""Device fit: time from spawn to the first answered request, and the memory of the whole
process tree (PSS summed over the daemon and its workers, so shared pages count once), stackd
against llama-server, at equal slots, context and threads, chat model only. Medians of N runs.

    .venv/bin/python bench/startup.py [--runs 3] [--slots 16] [--context 1024] [--threads 2]

Targets (issue 25): the first answer <= 1.0x llama-server's, the tree's PSS <= llama-server's
+ 25 MB, with engine workers. The PSS is read twice: once the first answer is in, and again once
every slot has prefilled a prompt of most of its context (`filled`): stackd's KV cache is
committed as its cells are written (engine.kv_commit = lazy), llama-server's all at load, so
the first reading shows what a device holds while it serves little, the second what it holds
at full use. Beside the PSS, its anonymous part (Pss_Anon: heaps, the engine's
buffers), to compare stackd with stackd on a busy machine: the file-backed part moves with
whoever else maps the same model file and libraries. Not across the two servers: llama-server
reads its weights from the file mapping, our worker repacks most of them into anonymous memory.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import peers
from inference import free_port

from stackd.store import defaults
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing.processes import process_tree  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


def rollup(pid: int) -> tuple[int, int]:
    """(PSS, anonymous PSS) of a process, in bytes; (0, 0) once it is gone."""
    fields = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("Pss", "Pss_Anon"):
                    fields[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return fields.get("Pss", 0), fields.get("Pss_Anon", 0)


def first_answer(port: int, model: str, key: str | None, proc, started: float) -> float:
    body = json.dumps({**CHAT, "model": model})
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    while True:
        if proc.poll() is not None:
            sys.exit("server exited early")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/v1/chat/completions", body, headers)
            if conn.getresponse().status == 200:
                return time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.01)


def run_stackd(args) -> tuple[float, int, int, int, int]:
    data = tempfile.mkdtemp(prefix="stackd-startup-")
    key = "sk-startup-bench-key"
    try:
        with open(os.path.join(data, "config.toml"), "w") as f:
            f.write(f"[http]\naccess_log = false\n[engine]\nslots = {args.slots}\n"
                    f"context_length = {args.context}\nthreads = {args.threads}\n"
                    f"isolation = \"{args.isolation}\"\nkv_commit = \"{args.kv_commit}\"\n"
                    f"[models]\npreload = [\"{defaults.CHAT_MODEL}\"]\n")
        subprocess.run([sys.executable, "-m", "stackd", "models", "defaults", "--data-dir", data],
                       cwd=ROOT, check=True, capture_output=True)
        from stackd.auth.keys import KeyStore
        store = KeyStore(data)
        _, key = store.create("bench", frozenset({"inference"}))
        port = free_port()
        return spawn_and_measure([sys.executable, "-m", "stackd", "serve", "--data-dir", data,
                                  "--inference-port", str(port), "--cluster-port", str(free_port())],
                                 port, defaults.CHAT_MODEL, key, args.slots, args.context)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def fill_every_slot(port: int, model: str, key: str | None, slots: int, context: int) -> None:
    """`slots` requests at once, each a prompt of about 3/4 of `context` tokens, all different
    (no prefix shared between slots), one token each: every slot's cache written."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}

    def one(i: int) -> None:
        words = f"slot {i}: " + " ".join(f"word{j}" for j in range(context // 5))   # ~3.5 tokens a word
        body = json.dumps({"model": model, "prompt": words, "max_tokens": 1, "temperature": 0})
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("POST", "/v1/completions", body, headers)
        response = conn.getresponse()
        if response.status != 200:
            sys.exit(f"filling a slot: HTTP {response.status}: {response.read()[:200]!r}")

    with concurrent.futures.ThreadPoolExecutor(slots) as pool:
        list(pool.map(one, range(slots)))


def spawn_and_measure(cmd: list[str], port: int, model: str, key: str | None,
                      slots: int, context: int) -> tuple[float, int, int, int, int]:
    """Seconds from spawn to the first answer, and the process tree's PSS and anonymous PSS
    once it serves, the PSS of the spawned process alone (stackd's daemon without its
    workers), and the tree's PSS once every slot's cache is written."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seconds = first_answer(port, model, key, proc, started)
        time.sleep(0.5)
        readings = [rollup(p) for p in process_tree(proc.pid)]
        fill_every_slot(port, model, key, slots, context)
        time.sleep(0.5)
        filled = sum(rollup(p)[0] for p in process_tree(proc.pid))
        return (seconds, sum(pss for pss, _ in readings), sum(anon for _, anon in readings),
                rollup(proc.pid)[0], filled)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def run_llama_server(args, binary: str) -> tuple[float, int, int, int, int]:
    port = free_port()
    return spawn_and_measure([binary, "-m", defaults.smollm2_path(), "--host", "127.0.0.1", "--port",
                              str(port), "-np", str(args.slots), "-c", str(args.slots * args.context),
                              "-t", str(args.threads), "-tb", str(args.threads), "--no-webui"],
                             port, "smollm2", None, args.slots, args.context)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isolation", default="worker")
    parser.add_argument("--kv-commit", default="lazy", choices=("lazy", "eager"))
    args = parser.parse_args()
    binary = peers.llama_server()
    results = {"stackd": [], "llama-server": []}
    for _ in range(args.runs):
        results["stackd"].append(run_stackd(args))
        results["llama-server"].append(run_llama_server(args, binary))
    medians = {name: tuple(statistics.median(r[i] for r in runs) for i in range(5))
               for name, runs in results.items()}
    for name, (seconds, memory, anonymous, _, filled) in medians.items():
        print(f"  {name:14s} first answer {seconds:6.2f} s   process tree PSS {memory / 1e6:7.1f} MB"
              f"   (anonymous {anonymous / 1e6:7.1f} MB)   filled {filled / 1e6:7.1f} MB")
    daemon = medians["stackd"][3]
    print(f"  stackd's daemon alone {daemon / 1e6:.1f} MB, its workers {(medians['stackd'][1] - daemon) / 1e6:.1f} MB")
    ours, peer = medians["stackd"], medians["llama-server"]
    print(f"  first answer: {ours[0] / peer[0]:.2f}x llama-server's (target <= 1.0x); "
          f"PSS: {(ours[1] - peer[1]) / 1e6:+.1f} MB (target <= +25 MB), filled {(ours[4] - peer[4]) / 1e6:+.1f} MB   "
          f"[{args.slots} slots x {args.context}, {args.threads} threads, isolation {args.isolation}, "
          f"kv_commit {args.kv_commit}]")


if __name__ == "__main__":
    main()
