"""Streaming generation throughput and latency: stackd against llama.cpp's llama-server
and llama-cpp-python's server, side by side in one run.

Same model file (the default SmolLM2-135M Q4_1), same thread count, the same slots and
per-sequence context for stackd and llama-server (-np equal to our slots), and the same
requests for every server: a fixed prompt, 128 tokens each with end-of-generation
suppressed, greedy. Servers run one after another on the same machine.

    .venv/bin/python bench/inference.py [--clients 16] [--seconds 30] [--threads 2]
    .venv/bin/python bench/inference.py --skip-llama-cpp-python --isolation worker \
        --model "$(.venv/bin/python -m testing.quantized_model)"    # another GGUF (Q4_K_M)

--model serves another GGUF file on every server (stackd: `serve --model`, which adds it to the
store and loads it at start). `--cpu avx2` runs an AVX2-only CPU's code on every server: llama.cpp
built with AVX-512 off (bench/peers.py, avx2_tree) under llama-server, llama-cpp-python's server
and our engine, and our kernels on their AVX2 path.
Reports aggregate completion tokens/s, time to first token p50/p95 and inter-token
latency p50/p95 at the given concurrency, and inter-token latency with one client.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import loadgen
import peers
from kernels_engine import cpu_name

from stackd.store import defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPT = ("Once upon a time, in a small village at the edge of a great forest, there lived a "
          "curious young girl who loved to explore. One morning she")
EOG_TOKENS = {"0": -100, "2": -100}    # <|endoftext|>, <|im_end|>: suppressed for every server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, path: str = "/v1/models", key: str | None = None,
               timeout: float = 180.0, expect: tuple = (200,)) -> None:
    import http.client
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited early with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
            if conn.getresponse().status in expect:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"server on {port} did not become ready")


def body(model: str, max_tokens: int) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "ignore_eos": True, "logit_bias": EOG_TOKENS}


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, model: str, key: str | None = None,
                 env: dict | None = None, cwd: str | None = None, ready_key=None):
        self.name, self.port, self.model, self.key = name, port, model, key
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})}, cwd=cwd)
        if ready_key is not None:            # stackd writes its admin key before it listens
            wait_ready(port, self.proc, path="/", key=None, expect=(401, 404))
            self.key = ready_key()
        wait_ready(port, self.proc, key=self.key)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def spawn_stackd(config: str, prefix: str = "stackd-bench-", env: dict | None = None,
                 model_file: str | None = None, injected: dict | None = None) -> Server:
    """A daemon on free ports with `config` (TOML) in a new data dir; ready once it answers
    with the admin key it wrote. `server.data` and `server.cluster_port` are set. `model_file`:
    a GGUF served in place of the config's preload (`serve --model`); its id becomes the model.
    `injected`: a test harness's faults and simulated peers (testing/serve.py: `-m testing.serve`,
    run from the checkout's root, which finds it)."""
    data = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(data, "config.toml"), "w") as f:
        f.write(config)
    port, cluster_port = free_port(), free_port()
    entry = ["-m", "stackd"]
    if injected:                  # the checkout's test support (testing/serve.py): cwd=ROOT finds it
        sys.path.insert(0, ROOT)
        from testing.serve import flags
        entry = ["-m", "testing.serve", *flags(injected)] if flags(injected) else entry
    server = Server("stackd", [sys.executable, *entry, "serve", "--data-dir", data,
                               "--inference-port", str(port), "--cluster-port", str(cluster_port)] +
                    (["--model", model_file] if model_file else []),
                    port, defaults.CHAT_MODEL, cwd=ROOT, env=env,
                    ready_key=lambda: open(os.path.join(data, "admin.key")).read().strip())
    server.data, server.cluster_port = data, cluster_port
    if model_file:
        server.model = loaded_model(server)
    return server


def loaded_model(server: Server) -> str:
    """The id of the model a daemon started with `--model` serves."""
    import http.client
    import json
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {server.key}"})
    models = json.loads(conn.getresponse().read())["data"]
    return next(m["id"] for m in models if m.get("kind") == "chat" and m.get("state") == "loaded")


def start_stackd(slots: int, context: int, threads: int, isolation: str = "worker", engine: str = "",
                 model_file: str | None = None, env: dict | None = None) -> Server:
    """`engine`: more lines of the [engine] section; `model_file`: a GGUF to serve instead."""
    preload = "" if model_file else f"[models]\npreload = [\"{defaults.CHAT_MODEL}\"]\n"
    return spawn_stackd(f"[http]\naccess_log = false\n[rate_limits]\ninference = 0\n"
                        f"[engine]\nslots = {slots}\ncontext_length = {context}\nthreads = {threads}\n"
                        f"isolation = \"{isolation}\"\n{engine}{preload}", model_file=model_file, env=env)


def start_llama_server(binary: str, slots: int, context: int, threads: int, model_file: str | None = None,
                       extra: tuple[str, ...] = ()) -> Server:
    """`extra`: more of llama-server's flags (bench/prompt_cache.py's --slot-save-path)."""
    port = free_port()
    return Server("llama-server", [binary, "-m", model_file or defaults.smollm2_path(), "--host", "127.0.0.1",
                                   "--port", str(port), "-np", str(slots), "-c", str(slots * context),
                                   "-t", str(threads), "-tb", str(threads), "--no-webui", *extra],
                  port, "smollm2")


def start_llama_cpp_python(python: str, context: int, threads: int, model_file: str | None = None,
                           env: dict | None = None) -> Server:
    port = free_port()
    return Server("llama-cpp-python", [python, "-m", "llama_cpp.server", "--model",
                                       model_file or defaults.smollm2_path(), "--host", "127.0.0.1", "--port",
                                       str(port), "--n_ctx", str(context), "--n_threads", str(threads),
                                       "--n_threads_batch", str(threads),
                                       # by default a new request cuts off the one streaming;
                                       # queue them instead, so every client gets its tokens
                                       "--interrupt_requests", "False"],
                  port, "smollm2", env=env)


def measure(server: Server, clients: int, seconds: float, max_tokens: int) -> loadgen.LoadResult:
    asyncio.run(loadgen.run(server.port, body(server.model, 8), 1, 2.0, server.key))   # warm up
    return asyncio.run(loadgen.run(server.port, body(server.model, max_tokens), clients, seconds,
                                   server.key))


def row(name: str, r: loadgen.LoadResult) -> str:
    return (f"  {name:18s} {r.tokens_per_second():9.1f} tok/s   TTFT p50 {r.ttft(0.5) * 1000:7.1f} ms "
            f"p95 {r.ttft(0.95) * 1000:7.1f} ms   ITL p50 {r.itl(0.5) * 1000:6.1f} ms "
            f"p95 {r.itl(0.95) * 1000:6.1f} ms   ({len(r.requests)} requests)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--skip-llama-cpp-python", action="store_true")
    parser.add_argument("--isolation", default="worker,inline",
                        help="stackd engine isolation modes to run: worker, inline or both")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default chat model)")
    parser.add_argument("--cpu", choices=["native", "avx2"], default="native",
                        help="avx2: every server runs an AVX2-only CPU's code (llama.cpp built without "
                             "AVX-512, our kernels' AVX2 path)")
    args = parser.parse_args()
    slots = args.clients

    env, engine = None, ""
    if args.cpu == "avx2":
        env, engine = peers.avx2_env(), "kernels = \"avx2\"\n"
    binary = os.path.join(peers.avx2_tree(), "llama-server") if args.cpu == "avx2" else peers.llama_server()
    python = None if args.skip_llama_cpp_python else peers.llama_cpp_python_server()
    results: dict[str, dict[int, loadgen.LoadResult]] = {}

    modes = [m.strip() for m in args.isolation.split(",") if m.strip()]
    starters = [("stackd" if mode == modes[0] else f"stackd ({mode})",
                 lambda mode=mode: start_stackd(slots, args.context, args.threads, mode, engine,
                                                model_file=args.model, env=env))
                for mode in modes]
    starters.append(("llama-server", lambda: start_llama_server(binary, slots, args.context, args.threads,
                                                                args.model)))
    if python:
        starters.append(("llama-cpp-python", lambda: start_llama_cpp_python(python, args.context,
                                                                            args.threads, args.model, env)))
    for name, start in starters:
        server = start()
        try:
            results[name] = {args.clients: measure(server, args.clients, args.seconds, args.max_tokens)}
            print(row(f"{name} c={args.clients}", results[name][args.clients]), flush=True)
            if name != "llama-cpp-python":
                results[name][1] = measure(server, 1, min(args.seconds, 15.0), args.max_tokens)
                print(row(f"{name} c=1", results[name][1]), flush=True)
        finally:
            server.stop()
            if name.startswith("stackd"):
                shutil.rmtree(server.data, ignore_errors=True)

    ours, peer = results["stackd"], results["llama-server"]
    c = args.clients
    print(f"\n{os.path.basename(args.model) if args.model else 'SmolLM2-135M Q4_1'} on {cpu_name()}"
          f"{' (AVX2-only builds)' if args.cpu == 'avx2' else ''}, "
          f"{args.threads} threads, {slots} slots, {args.max_tokens} tokens per "
          f"request, {args.seconds:g} s closed loop")
    print(f"  tokens/s at c={c}: {ours[c].tokens_per_second() / peer[c].tokens_per_second():.2f}x "
          f"llama-server (target >= 1.75x, kernels issue)")
    if "llama-cpp-python" in results:
        print(f"  tokens/s at c={c}: {ours[c].tokens_per_second() / results['llama-cpp-python'][c].tokens_per_second():.2f}x "
              f"llama-cpp-python's server (target >= 5x)")
    print(f"  TTFT p50 at c={c}: {ours[c].ttft(0.5) / peer[c].ttft(0.5):.2f}x llama-server's (target <= 0.7x)")
    print(f"  ITL p50 at c=1:  {ours[1].itl(0.5) / peer[1].itl(0.5):.2f}x llama-server's (target <= 0.8x)")
    for mode in modes[1:]:
        other = results[f"stackd ({mode})"]
        print(f"  stackd {modes[0]} vs {mode}: tokens/s at c={c} {ours[c].tokens_per_second() / other[c].tokens_per_second():.3f}x "
              f"(target >= 0.98x), ITL p50 at c=1 {ours[1].itl(0.5) / other[1].itl(0.5):.3f}x (target <= 1.03x)")


if __name__ == "__main__":
    main()
