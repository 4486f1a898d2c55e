"""How much a hostile client slows everyone else: a bystander's streaming inter-token time,
unloaded and while each attack of the hostile-request review runs beside it (goal: p50 within
2x of unloaded). Also the worst /v1/health latency seen on the other port during each attack.

    .venv/bin/python bench/hostile.py [--seconds 10] [--sampler-only] [--rate-limits default|off]
                                      [--attacker-nice 19]
    .venv/bin/python bench/hostile.py --flood-rounds 10 [--flood-unread] [--flood-busy 2]

`--flood-rounds N` measures instead a bystander's time to first token behind a single-key flood
(issue 24; target <= 2 s), on a daemon with the default engine settings (16 slots, a queue of
256): the attacker's ordinary key sends 17 streaming completions with n 16, max_tokens 2000 and
ignore_eos (8 fit its key_share, 9 get 429), then a second key's two-token chat (time to its whole answer). Each
round runs after other hostile traffic on the same daemon (streams hung up mid-way, requests
cancelled while queued, n > 1 requests, a prompt past the context), the state that once let a
ninth request in. `--flood-unread`: nobody reads the flood's streams past their heads (issue 40's
attacker); `--flood-busy N`: N processes spin beside the daemon for the whole run (a busy
machine). Prints the bystander's time per round, then p50 and max over the rounds (a round with
no answer in 60 s counts as 60 s).

First, without a daemon: what one sampled token costs the engine thread under a grammar that
keeps rejecting the model's picks, with the walk by logit (what the engine does) and with the
full-vocabulary pass it replaced (the regression reference), on the real model's logits.

The daemon runs with the real default models (4 slots of 512 tokens) plus a copy of the chat
model whose template is hostile; attacks come from one key, the bystander uses another. Two
attacker threads send as fast as they are answered. `--rate-limits default` (the default) gives
the attacker's key the daemon's own limit (rate_limits.inference: an ordinary key, as in the
hostile-request review); `off` lifts it (the worst case). The bystander's key and the admin key
of the health probe are unlimited either way: they are the instruments.

Beside each row: the CPU the daemon's process used (its loop and its threads; the engine workers
are processes of their own) and the CPU of this script's process, where the attacker's client
runs: on one host the attacker's own CPU comes off the same cores as the engines'.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import sys
import socket
import tempfile
import threading
import time

import orjson

import loadgen

from stackd.store.store import ModelStore
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing.daemon import Daemon, create_key  # noqa: E402
from testing.gguf_patch import HOSTILE, HOSTILE_TEMPLATE, with_chat_template  # noqa: E402

CHAT = "smollm2-135m-instruct"
STREAM = {"model": CHAT, "prompt": "Once upon a time, in a small village, there lived", "stream": True,
          "max_tokens": 64, "temperature": 0, "logit_bias": {"0": -100, "2": -100}}


post = loadgen.post_json


def chat(port, key, content, **extra):
    return post(port, "/v1/chat/completions", key, {
        "model": extra.pop("model", CHAT), "messages": [{"role": "user", "content": content}],
        "max_tokens": 4, **extra})


def schema(kind):
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": kind}}}


def attacks(node: Daemon, key: str) -> dict:
    inf = node.inference_port

    def flood_pipelined():
        sock = socket.create_connection(("127.0.0.1", node.cluster_port))
        sock.setblocking(False)
        data = b"GET /v1/health HTTP/1.1\r\nHost: a\r\n\r\n" * 20000
        try:
            sock.send(data)
        except BlockingIOError:
            pass
        time.sleep(2)
        sock.close()

    def abandoned_embedding():
        body = orjson.dumps({"model": "all-minilm-l6-v2", "input": ["a sentence to embed"] * 2048})
        sock = socket.create_connection(("127.0.0.1", inf))
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + key.encode() +
                     b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.3)
        sock.close()

    return {
        "maxLength 20000 schema": lambda: chat(inf, key, "hi", **schema({"type": "string", "maxLength": 20000})),
        "minItems 5,000,000 schema": lambda: chat(inf, key, "hi", **schema({"type": "array", "minItems": 5000000})),
        "3,000-value enum": lambda: chat(inf, key, "hi", **schema({"enum": [f"v{i}" for i in range(3000)]})),
        "256-value enum (allowed)": lambda: chat(inf, key, "hi", max_tokens=16,
                                                 **schema({"enum": [f"value {i}" for i in range(256)]})),
        "boolean schema + min_tokens": lambda: post(inf, "/v1/completions", key, {
            "model": CHAT, "prompt": "Yes or no?", "max_tokens": 30, "min_tokens": 20, **schema({"type": "boolean"})}),
        "template loop": lambda: chat(inf, key, "loop", model=HOSTILE),
        "template 300 MB string": lambda: chat(inf, key, "mem", model=HOSTILE),
        "pipelined flood, never read": flood_pipelined,
        "one key, 17 x n=4, ignore_eos": lambda: [f.result() for f in [
            concurrent.futures.ThreadPoolExecutor(17).submit(
                chat, inf, key, "story", n=4, max_tokens=48, ignore_eos=True) for _ in range(17)]],
        "2,048 embeddings, hung up": abandoned_embedding,
    }


def sampler_costs(steps: int = 24) -> None:
    """Per grammar and sampling mode: median milliseconds per sampled token, walk vs full pass."""
    import llama_cpp
    import numpy as np

    from stackd.engine.core import Sampler, SamplingParams, Vocab
    from stackd.chat.grammar import json_schema_grammar
    from stackd.store import defaults

    path = defaults.smollm2_path()
    vocab = Vocab(path)
    llm = llama_cpp.Llama(path, n_ctx=256, logits_all=True, verbose=False)
    eog = sorted({vocab.token_eos, 0, 2})
    cases = [("256-value enum", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
              json_schema_grammar({"enum": [f"value {i}" for i in range(256)]}), 0),
             ("boolean + min_tokens 20", "Yes or no?", json_schema_grammar({"type": "boolean"}), 20)]
    modes = [("greedy", dict(temperature=0.0)),
             ("defaults", dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1))]
    print(f"{'grammar':26s} {'sampling':9s} {'walk ms':>8s} {'full ms':>8s} {'ratio':>6s} {'checked/rejected':>17s}")
    for name, prompt, grammar, min_tokens in cases:
        for mode, sampling in modes:
            samplers = []
            for full in (False, True):
                params = SamplingParams()
                params.grammar = grammar
                for key, value in sampling.items():
                    setattr(params, key, value)
                samplers.append(Sampler(vocab, params, full_vocabulary=full))
            times = ([], [])
            llm.reset()
            llm.eval(vocab.tokenize(prompt, True, True))
            for step in range(steps):
                logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
                picks = []
                for s, spent in zip(samplers, times):
                    t = time.perf_counter()
                    picks.append(s.sample(logits, step < min_tokens, eog))
                    spent.append(time.perf_counter() - t)
                token = picks[1]
                if token < 0 or token in eog:
                    break
                for s in samplers:
                    s.accept(token)
                llm.eval([token])
            walk, full = (sorted(t)[len(t) // 2] * 1000 for t in times)
            counts = samplers[0].counts
            per_reject = counts["checked"] / max(counts["rejected"], 1)
            print(f"{name:26s} {mode:9s} {walk:8.2f} {full:8.2f} {full / walk:6.1f} {per_reject:17.0f}", flush=True)
    llm.close()


RATE_LIMITS = {
    "off": "[rate_limits]\ninference = 0\ncluster = 0\n",
    "default": "[rate_limits.keys.bystander]\ninference = 0\n[rate_limits.keys.admin]\ncluster = 0\n",
}


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a whole process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stream_head(port: int, key: str, path: str, body: dict, read: bool = True):
    """A streaming POST: its status and the open connection (None if refused). With `read`, a
    thread reads the body; without it nobody reads past the head (a client that stalls: its
    socket's buffers fill, then the daemon's)."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, orjson.dumps(body), {"Authorization": f"Bearer {key}",
                                                    "Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        response.read()
        conn.close()
        return response.status, None
    if read:
        threading.Thread(target=lambda: _drain(response), daemon=True).start()
    return 200, conn


def _drain(response) -> None:
    try:
        while response.read(65536):
            pass
    except Exception:
        pass


def busy_loops(n: int) -> list:
    """n processes that spin at normal priority (a machine busy with other work)."""
    import subprocess
    import sys
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def other_hostile_traffic(port: int, key: str) -> None:
    """What ran before the flood in the run that let a ninth request in: streams hung up after
    their first bytes, queued requests cancelled, n > 1 requests, a prompt past the context."""
    long = {"model": CHAT, "prompt": "Tell me a story.", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        opened = list(pool.map(lambda _: stream_head(port, key, "/v1/completions", {**long, "n": 4}),
                               range(8)))
    time.sleep(2.0)                               # some stream, others still wait for a slot
    for _, conn in opened:
        if conn is not None:
            conn.close()                          # hung up mid-stream; queued choices cancelled
    post(port, "/v1/completions", key, {"model": CHAT, "prompt": "Hi", "n": 8, "max_tokens": 8})
    post(port, "/v1/completions", key, {"model": CHAT, "prompt": "word " * 5000, "max_tokens": 8})


def flood_ttft(rounds: int, unread: bool = False, busy: int = 0) -> dict:
    """The bystander's time to its whole two-token answer behind one key's flood, per round;
    `unread`: nobody reads the flood's streams; `busy`: that many spinning processes beside
    the daemon for the whole run. Returns p50 and max in seconds (an unanswered round counts
    as its 60 s limit)."""
    body = {"model": CHAT, "prompt": "Write a long story.", "n": 16, "max_tokens": 2000,
            "ignore_eos": True, "stream": True}
    chat_body = {"model": CHAT, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    times = []
    with tempfile.TemporaryDirectory(prefix="stackd-flood-") as tmp:
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir, mode=0o700)
        node = Daemon(data_dir, models=True)
        spinners = []
        try:
            attacker = create_key(data_dir, "attacker", "inference")
            bystander = create_key(data_dir, "bystander", "inference")
            time.sleep(1.5)
            started = time.perf_counter()          # the same answer with nothing else running
            post(node.inference_port, "/v1/chat/completions", bystander, chat_body)
            print(f"bystander answer alone: {time.perf_counter() - started:.2f}s "
                  f"(flood streams {'unread' if unread else 'read'}, {busy} busy loops)")
            spinners = busy_loops(busy)
            print(f"{'round':>5s} {'admitted':>8s} {'429':>4s} {'bystander answer':>17s}")
            for n in range(rounds):
                other_hostile_traffic(node.inference_port, attacker)
                with concurrent.futures.ThreadPoolExecutor(17) as pool:
                    floods = list(pool.map(lambda _: stream_head(node.inference_port, attacker,
                                                                 "/v1/completions", body, read=not unread),
                                           range(17)))
                time.sleep(0.5)
                started = time.perf_counter()          # its whole answer: first token and one more
                status = bystander_post(node.inference_port, bystander, chat_body, limit=60.0)
                ttft = time.perf_counter() - started if status == 200 else 60.0
                times.append(ttft)
                statuses = [s for s, _ in floods]
                print(f"{n + 1:5d} {statuses.count(200):8d} {statuses.count(429):4d} "
                      f"{ttft:16.2f}s {'' if status == 200 else status}", flush=True)
                for _, c in floods:
                    if c is not None:
                        c.close()
                time.sleep(2.0)                   # the flood's cancellations land
            assert node.proc.poll() is None, "the daemon died"
        finally:
            for p in spinners:
                p.kill()
                p.wait()
            node.stop()
    times.sort()
    summary = {"p50": times[len(times) // 2], "max": times[-1]}
    print(f"bystander answer over {rounds} rounds: p50 {summary['p50']:.2f}s, max {summary['max']:.2f}s")
    return summary


def bystander_post(port: int, key: str, body: dict, limit: float):
    """The bystander's chat, waiting at most `limit` seconds (then 'timeout')."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=limit)
    try:
        conn.request("POST", "/v1/chat/completions", orjson.dumps(body),
                     {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    except (socket.timeout, TimeoutError):
        return "timeout"
    finally:
        conn.close()


def measure(node: Daemon, key: str, seconds: float, attack=None, attacker_nice: int = 0) -> dict:
    """The bystander's inter-token time (p50, p95, ms), the worst health latency (ms), and the
    CPU share (% of one core) of the daemon's process and of this one while it streamed."""
    stop = threading.Event()
    worst_health = [0.0]

    def attacker():
        if attacker_nice:                # this thread only: Linux nice is per thread
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), attacker_nice)
        while not stop.is_set():
            attack()

    def prober():
        while not stop.is_set():
            t = time.perf_counter()
            node.request("GET", "/v1/health", key=node.admin_key)
            worst_health[0] = max(worst_health[0], time.perf_counter() - t)
            time.sleep(0.05)

    threads = [threading.Thread(target=prober, daemon=True)]
    if attack is not None:
        threads += [threading.Thread(target=attacker, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    daemon_cpu, own_cpu, started = cpu_seconds(node.proc.pid), cpu_seconds(os.getpid()), time.monotonic()
    result = asyncio.run(loadgen.run(node.inference_port, STREAM, 1, seconds, key))
    elapsed = time.monotonic() - started
    daemon_cpu, own_cpu = cpu_seconds(node.proc.pid) - daemon_cpu, cpu_seconds(os.getpid()) - own_cpu
    stop.set()
    for t in threads:
        t.join(timeout=120)
    return {"p50": result.itl(0.5) * 1000, "p95": result.itl(0.95) * 1000, "health": worst_health[0] * 1000,
            "daemon_cpu": 100 * daemon_cpu / elapsed, "client_cpu": 100 * own_cpu / elapsed}


def row(name: str, m: dict, base: dict) -> str:
    return (f"{name:34s} {m['p50']:8.1f}ms {m['p95']:8.1f}ms {m['p50'] / base['p50']:6.2f} "
            f"{m['health']:11.1f}ms {m['daemon_cpu']:9.0f}% {m['client_cpu']:9.0f}%")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sampler-only", action="store_true", help="only the sampler costs, no daemon")
    parser.add_argument("--only", default="", help="semicolon-separated parts of attack names to run "
                                                   "(and no sampler costs)")
    parser.add_argument("--rate-limits", choices=sorted(RATE_LIMITS), default="default",
                        help="the attacker key's rate limit: the daemon's default, or none")
    parser.add_argument("--attacker-nice", type=int, default=0,
                        help="niceness of the attacking client's threads (19: close to an attacker "
                             "on another machine, whose client takes no CPU from the daemon's cores)")
    parser.add_argument("--flood-rounds", type=int, default=0,
                        help="only the bystander's time to first token behind a single-key flood, "
                             "this many rounds")
    parser.add_argument("--flood-unread", action="store_true",
                        help="with --flood-rounds: nobody reads the flood's streams past their head")
    parser.add_argument("--flood-busy", type=int, default=0,
                        help="with --flood-rounds: this many spinning processes beside the daemon")
    args = parser.parse_args()
    if args.flood_rounds:
        flood_ttft(args.flood_rounds, args.flood_unread, args.flood_busy)
        return
    if not args.only:
        sampler_costs()
    if args.sampler_only:
        return
    wanted = [w.strip() for w in args.only.split(";") if w.strip()]
    with tempfile.TemporaryDirectory(prefix="stackd-hostile-") as tmp:
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir, mode=0o700)
        ModelStore(data_dir).import_file(
            HOSTILE, with_chat_template(HOSTILE_TEMPLATE, os.path.join(tmp, "h.gguf")), source="local")
        node = Daemon(data_dir, RATE_LIMITS[args.rate_limits] +
                      "[engine]\nslots = 4\nmax_queue = 8\ncontext_length = 512\n", models=True)
        try:
            attacker = create_key(data_dir, "attacker", "inference")
            bystander = create_key(data_dir, "bystander", "inference")
            time.sleep(1.5)
            chat(node.inference_port, attacker, "hello", model=HOSTILE)      # load it beforehand
            base = measure(node, bystander, args.seconds)
            print(f"rate limits: {args.rate_limits}")
            print(f"{'attack':34s} {'ITL p50':>9s} {'ITL p95':>9s} {'x p50':>6s} {'worst health':>13s} "
                  f"{'daemon CPU':>10s} {'client CPU':>10s}")
            print(row("(none)", base, base), flush=True)
            for name, attack in attacks(node, attacker).items():
                if wanted and not any(w in name for w in wanted):
                    continue
                print(row(name, measure(node, bystander, args.seconds, attack, args.attacker_nice), base),
                      flush=True)
            assert node.proc.poll() is None, "the daemon died"
        finally:
            node.stop()


if __name__ == "__main__":
    main()
