"""Models on demand under a memory limit (docs/api.md, "Models on demand"): three chat models
whose sum exceeds models.memory_limit_mb (it holds two), and clients that each alternate
requests between them, so that the daemon keeps swapping one model out for another.

    .venv/bin/python bench/model_swap.py [--clients 4] [--requests 12] [--max-tokens 8]

The store holds the default chat model and two copies of it with other chat templates (three
files, as tests/blackbox/test_models_on_demand.py makes them); the limit comes from the
planner's own estimate. Client i asks for model (i + k) mod 3 on its k-th request, so every
round of requests wants all three at once. Reports: every request's status (the goal: all
answered, none failed), the loads and evictions /metrics counted, a load's mean time (its
engine's start: stackd_model_load_seconds_total over stackd_model_loads_total), and the latency
of the requests that found their model loaded against those that waited for it (a load, and
before it the end of the requests of the model it evicts).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from stackd.engine.config import EngineConfig  # noqa: E402
from stackd.runtime.planner import MIB, Planner  # noqa: E402
from stackd.store.defaults import CHAT_MODEL, import_defaults  # noqa: E402
from stackd.store.store import ModelStore  # noqa: E402
from testing.daemon import Daemon  # noqa: E402
from testing.gguf_patch import with_chat_template  # noqa: E402

MODELS = (CHAT_MODEL, "chat-b", "chat-c")
CONTEXT, SLOTS = 2048, 4


def make_store(work: str) -> tuple[str, int]:
    """-> (the data dir holding the three models, a memory limit in MiB for two of them)."""
    data = os.path.join(work, "data")
    store = ModelStore(data)
    import_defaults(store)
    for name in MODELS[1:]:
        template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{# " + name + " #}"
        store.import_file(name, with_chat_template(template, os.path.join(work, f"{name}.gguf")), source="bench")
    planner = Planner(EngineConfig(slots=SLOTS, context_length=CONTEXT), 0, 0, lambda node: 0)
    need = [sum(planner.estimate(store.get(m), CONTEXT).values()) for m in MODELS]
    limit = math.ceil(max(need[i] + need[j] for i in range(3) for j in range(i + 1, 3)) / MIB)
    assert limit * MIB < sum(need), "the limit must hold two models and not three"
    return data, limit


def loaded(daemon: Daemon) -> set[str]:
    _, _, body = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    return {m["id"] for m in body["data"] if m.get("state") == "loaded"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=12, help="per client")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-model-swap-")
    data, limit = make_store(work)
    config = (f"[rate_limits]\ninference = 0\n[engine]\nslots = {SLOTS}\ncontext_length = {CONTEXT}\n"
              f"[models]\npreload = []\nkeep_alive = -1\nmemory_reserve_mb = 0\nmemory_limit_mb = {limit}\n"
              "load_wait = 600\n")
    daemon = Daemon(data, config, models=True)
    results: list[tuple[str, int, float, bool]] = []     # (model, status, seconds, its model was loaded)
    lock = threading.Lock()

    def client(i: int) -> None:
        for k in range(args.requests):
            model = MODELS[(i + k) % len(MODELS)]
            was_loaded = model in loaded(daemon)
            t0 = time.perf_counter()
            status, _, body = daemon.request("POST", "/v1/chat/completions", port="inference", key=daemon.admin_key,
                                             body={"model": model, "max_tokens": args.max_tokens, "temperature": 0,
                                                   "messages": [{"role": "user", "content": f"Say hello, {i}-{k}."}]})
            with lock:
                results.append((model, status, time.perf_counter() - t0, was_loaded))
            if status != 200:
                print(f"client {i} request {k} ({model}): {status} {body}", flush=True)

    try:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        loads = daemon.metric("stackd_model_loads_total")
        evictions = daemon.metric("stackd_model_evictions_total")
        load_seconds = daemon.metric("stackd_model_load_seconds_total")
    finally:
        daemon.stop()
    ok = [r for r in results if r[1] == 200]
    waited = [r[2] for r in ok if not r[3]]
    found = [r[2] for r in ok if r[3]]
    print(json.dumps({
        "clients": args.clients, "requests": len(results), "answered": len(ok), "failed": len(results) - len(ok),
        "memory_limit_mb": limit, "loads": int(loads), "evictions": int(evictions), "wall_s": round(wall, 1),
        "load_s_mean": round(load_seconds / loads, 2) if loads else None,
        "latency_s_median": {"model_loaded": round(statistics.median(found), 2) if found else None,
                             "waited_for_a_load": round(statistics.median(waited), 2) if waited else None},
    }))


if __name__ == "__main__":
    main()
