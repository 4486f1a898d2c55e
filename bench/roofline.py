"""This machine's roofs, measured, and where a decode step's and a long prompt's time goes under them.

Measured here with the engine's thread count, not quoted from a data sheet:
- the memory roof: bytes a second the threads read from a buffer the size of the model's weights
  (testing.kernels_check.read_bandwidth; from the last-level cache where they fit in it), and
  from one far larger than the caches (DRAM), printed beside;
- what a node costs ggml's team whatever its work (its barrier and dispatch:
  testing.kernels_check.time_nodes), the floor under a step's nodes;
- the compute roof of each ISA path of ours: multiply-adds a second of our MUL_MAT on a weight
  that stays in cache (the model's weight type, 576 x 1536, 16 tokens: a decode step's shape).

Then the engine (no HTTP, greedy, drafting off so that a step is one token a stream) decodes
at each stream count with kernels/src/profile.h timing its graphs, and each figure is put
against its roof: at one stream the weights a token reads over the bandwidth (the ceiling in
tokens/s), at many the multiply-adds a step over the path's peak. The step is split into
phases: our matmuls, the vocabulary projection (LM head), our attention, the embedding rows,
ggml's own ops with its barriers and a thread's idle (what is left of the graphs' compute),
llama.cpp around the graph (building it, allocating, inputs, logits out: llama_decode less
the compute), sampling, and the scheduler with its events.

--prefill N,... times one request's prompt of N tokens to its first token with the same split,
beside llama-batched-bench's prompt processing of N tokens on the same file and threads
(--peer).

--prompt-tokens N decodes after prompts of N tokens (32 by default): a step's attention then
reads N cells a stream, as an agent's turn after its tool list does.

    .venv/bin/python bench/roofline.py [--threads 2] [--streams 1,16] [--peer]
    .venv/bin/python bench/roofline.py --streams 1 --prompt-tokens 2000 --peer
    .venv/bin/python bench/roofline.py --prefill 512,2000,4000 --streams "" --peer
    .venv/bin/python bench/roofline.py --kernels avx2      # one path forced for the engine runs
    .venv/bin/python bench/roofline.py --cpu avx2 --peer   # an AVX2-only CPU's code on both sides
    .venv/bin/python bench/roofline.py --rounds 3 --peer   # medians of 3 alternating rounds
    .venv/bin/python bench/roofline.py --graph-reuse off   # the A/B of llama.cpp's graph reuse
    .venv/bin/python bench/roofline.py --fusion off        # the A/B of graph fusion
    .venv/bin/python bench/roofline.py --prefill 2000 --streams "" --prefill-attention ggml
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

import kernels_engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PROMPT_TOKENS, GEN_TOKENS = 32, 128
BANDWIDTH_BYTES = 1 << 30          # far past any last-level cache here
PEAK_SHAPE = (576, 1536, 16)       # K, rows, tokens: 0.5 MB of Q4_1, resident in L2
TEXT = ("The committee met on a grey morning to review the harbour's plans, the budget for the new "
        "pier, the fishermen's complaints about the dredging and the schedule of the ferries. ")


def model_facts(path: str) -> dict:
    from stackd.store import gguf_check
    info = gguf_check.check_gguf(path)
    return {"type": re.sub(r"_k(_[sml])?$", "_K", info.quantization.lower()),   # Q4_K_M: q4_K
            "bytes": info.block_bytes + info.output_bytes,          # weights a decode step reads
            "macs": info.block_elements + info.output_elements}     # multiply-adds a token


# ---- the roofs ----

def roofs(threads: int, weight_type: str, weight_bytes: int) -> dict:
    """The read bandwidth of a buffer the size of the model's weights (what a decode step reads:
    from the last-level cache where they fit, as SmolLM2's 97 MB do in a 480 MiB L3) and of one
    far larger (DRAM); the compute peak of each path."""
    from stackd.engine import accel
    from testing import kernels_check
    bandwidth = kernels_check.read_bandwidth(weight_bytes, threads, 10)
    dram = kernels_check.read_bandwidth(BANDWIDTH_BYTES, threads, 5)
    k, rows, tokens = PEAK_SHAPE
    peaks = {}
    for path in accel.PATHS:
        if path == "scalar" or not accel.cpu_supports(path):
            continue
        timed = kernels_check.time_mul_mat(weight_type, k, rows, tokens, path, threads, 200)
        if timed is not None:
            peaks[path] = k * rows * tokens / timed[1]
    node = kernels_check.time_nodes(500, threads, 50)      # a node's barrier and dispatch
    return {"bandwidth": bandwidth, "dram": dram, "peaks": peaks, "node": node}


# ---- the engine, in a process of its own (the kernels register once a process) ----

def wait_for(engine, ids: set[int], done: bool, ended: set[int]) -> None:
    """Until every request of `ids` has had an event (done=False: its first token) or has ended
    (done=True); the requests seen to end go into `ended` (one batch of events can hold a
    request's first token and its last)."""
    from stackd.engine.core import STATUS_RUNNING
    pending = set(ids) - ended
    while pending:
        select.select([engine.fileno()], [], [])
        for event in engine.take_events():
            if event.status != STATUS_RUNNING:
                ended.add(event.id_request)
            if not done or event.status != STATUS_RUNNING:
                pending.discard(event.id_request)


def measured(engine, run) -> dict:
    """Runs `run()` (returns its seconds) with the profile on; the window's counters."""
    from stackd.engine import accel
    before = engine.stats()
    accel.profile(True)
    seconds = run()
    profile = accel.profile_read()
    accel.profile(False)
    after = engine.stats()
    stats = {k: after[k] - before[k] for k in after}
    return {"seconds": seconds, "stats": stats, "profile": profile}


def params():
    from stackd.engine.core import SamplingParams
    p = SamplingParams()
    p.temperature = 0.0
    p.ignore_eos = True
    return p


def decode_window(engine, n: int, first_id: int, prompt_tokens: int = PROMPT_TOKENS) -> dict:
    """n streams of a prompt_tokens-token prompt; the window from every stream's first token to the last."""
    from stackd.engine.core import SUBMIT_ACCEPTED
    prompt = engine.tokenize(TEXT * (prompt_tokens // 20 + 2), False, True)[:prompt_tokens]
    ids = set(range(first_id, first_id + n))
    for rid in sorted(ids):
        assert engine.submit(rid, prompt, GEN_TOKENS, [], params()) == SUBMIT_ACCEPTED
    ended: set[int] = set()
    wait_for(engine, ids, False, ended)      # prefill done: every stream has its first token

    def rest() -> float:
        start = time.perf_counter()
        wait_for(engine, ids, True, ended)
        return time.perf_counter() - start
    return measured(engine, rest)


def prefill_window(engine, n_tokens: int, rid: int) -> dict:
    """One request's prompt of n_tokens, to its first token (a fresh prefix: nothing reused)."""
    from stackd.engine.core import SUBMIT_ACCEPTED
    text = f"Request {rid}: " + TEXT * (n_tokens // 20 + 2)
    prompt = engine.tokenize(text, False, True)[:n_tokens]
    assert len(prompt) == n_tokens

    def one() -> float:
        start = time.perf_counter()
        assert engine.submit(rid, prompt, 1, [], params()) == SUBMIT_ACCEPTED
        wait_for(engine, {rid}, True, set())
        return time.perf_counter() - start
    return measured(engine, one)


def child(args) -> None:
    from stackd.engine import accel
    accel.commit_on_write()
    path = accel.register(args.kernels)
    if path is not None:
        accel.set_fusion(args.fusion == "on")
        accel.set_prefill_attention(args.prefill_attention == "ours")
    from stackd.engine.core import Engine
    out: dict = {"path": path, "decode": {}, "prefill": {}}
    streams = [int(s) for s in args.streams.split(",") if s]
    prefills = [int(s) for s in args.prefill.split(",") if s]
    model = kernels_engine.model_path(args.model)
    if streams:
        context = max(256, args.prompt_tokens + GEN_TOKENS + 64)
        engine = Engine(model, slots=max(streams), context_length=context, batch=512, threads=args.threads,
                        flash_attn=1, speculative_draft_max=0)
        decode_window(engine, 2, 1)          # warm up
        for i, n in enumerate(streams):
            out["decode"][n] = decode_window(engine, n, 1000 * (i + 1), args.prompt_tokens)
        engine.close()
    if prefills:
        engine = Engine(model, slots=1, context_length=max(prefills) + 64, batch=512, threads=args.threads,
                        flash_attn=1, speculative_draft_max=0)
        prefill_window(engine, 64, 1)        # warm up
        for i, n in enumerate(prefills):
            out["prefill"][n] = prefill_window(engine, n, 10 + i)
        engine.close()
    print(json.dumps(out))


def engine_runs(args) -> dict:
    command = [sys.executable, __file__, "--child", "--threads", str(args.threads), "--streams", args.streams,
               "--prefill", args.prefill, "--prompt-tokens", str(args.prompt_tokens), "--kernels", args.kernels,
               "--fusion", args.fusion, "--prefill-attention", args.prefill_attention] + (["--model", args.model] if args.model else [])
    env = {**os.environ, **kernels_engine.CHILD_ENV}
    if args.graph_reuse == "off":     # llama.cpp rebuilds every step's graph (its llama_context)
        env["LLAMA_GRAPH_REUSE_DISABLE"] = "1"
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout
    result = json.loads(out.splitlines()[-1])
    for part in ("decode", "prefill"):
        result[part] = {int(k): v for k, v in result[part].items()}
    return result


# ---- the peer ----

def peer_prefill(n_tokens: int, threads: int, model: str | None) -> float:
    """Seconds llama-batched-bench takes for one prompt of n_tokens (its S_PP), same flags as
    kernels_engine's (flash attention on, batch 512)."""
    out = subprocess.run([kernels_engine.batched_bench_binary(), "-m", kernels_engine.model_path(model),
                          "-c", str(n_tokens + 64), "-b", "512", "-ub", "512", "-npp", str(n_tokens),
                          "-ntg", "1", "-npl", "1", "-t", str(threads), "-fa", "on"],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0] == str(n_tokens):
            return float(cells[4])   # T_PP s
    raise RuntimeError(f"llama-batched-bench printed no row for {n_tokens} tokens:\n{out}")


# ---- the tables ----

PHASES = [("matmuls (layers)", "matmul"), ("LM head", "lm_head"), ("attention (ours)", "attention"),
          ("embedding rows", "get_rows"), ("tensor split's exchange", "exchange"),
          ("adds and norms (ours, fused)", "norms")]


def phase_rows(window: dict, per: float) -> list[tuple[str, float]]:
    """(phase, seconds) per `per` (steps, or one request) of the window's time."""
    p, s = window["profile"], window["stats"]
    ours = sum(p[key][0] for _, key in PHASES)
    graph = p["graph"][0]
    decode = s["t_decode_us"] / 1e6
    rows = [(name, p[key][0]) for name, key in PHASES if p[key][1]]
    rows += [("ggml's ops, barriers, idle", graph - ours),
             ("llama.cpp around the graph", decode - graph),
             ("sampling", s["t_sample_us"] / 1e6),
             ("scheduler, batch, events", (s["t_schedule_us"] + s["t_batch_us"] + s["t_emit_us"]) / 1e6)]
    counted = sum(v for _, v in rows)
    rows.append(("not in the engine's counters", window["seconds"] - counted))
    return [(name, v / per) for name, v in rows]


def print_phases(title: str, rows: list[tuple[str, float]], unit_ms: bool = True) -> None:
    total = sum(v for _, v in rows)
    print(f"\n{title}\n\n| phase | ms | share |\n|---|---|---|")
    for name, v in rows:
        print(f"| {name} | {v * 1e3:.3f} | {100 * v / total:.1f} % |")
    print(f"| total | {total * 1e3:.3f} | |")


def median_index(values: list[float]) -> int:
    """The index of the median value (the upper one of an even count)."""
    return sorted(range(len(values)), key=values.__getitem__)[len(values) // 2]


def rounds(args) -> tuple[dict, dict, dict]:
    """The engine's runs and the peer's, alternating args.rounds times. Each stream count's (and
    prompt length's) window is the round of the median tok/s (first-token time); each ratio
    to the peer is the median of the rounds' own ratios (a round's sides ran back to back)."""
    engine, decode_peer, prefill_peer = [], [], []
    streams = [int(s) for s in args.streams.split(",") if s]
    prompts = [int(s) for s in args.prefill.split(",") if s]
    for _ in range(args.rounds):
        engine.append(engine_runs(args))
        if args.peer:
            decode_peer.append(kernels_engine.batched_bench(streams, args.threads, args.model) if streams else {})
            prefill_peer.append({n: peer_prefill(n, args.threads, args.model) for n in prompts})
    median = kernels_engine.median
    runs = {"path": engine[0]["path"], "decode": {}, "prefill": {}}
    peer, peer_prefills = {}, {}
    for n in sorted(engine[0]["decode"]):
        tok_s = [r["decode"][n]["stats"]["n_tokens_sampled"] / r["decode"][n]["seconds"] for r in engine]
        runs["decode"][n] = engine[median_index(tok_s)]["decode"][n]
        if decode_peer:
            peer[n] = {"decode": median([p[n]["decode"] for p in decode_peer]),
                       "ratio": median([t / p[n]["decode"] for t, p in zip(tok_s, decode_peer)])}
    for n in sorted(engine[0]["prefill"]):
        seconds = [r["prefill"][n]["seconds"] for r in engine]
        runs["prefill"][n] = engine[median_index(seconds)]["prefill"][n]
        if prefill_peer:
            peer_prefills[n] = {"seconds": median([p[n] for p in prefill_peer]),
                                "ratio": median([s / p[n] for s, p in zip(seconds, prefill_peer)])}
    return runs, peer, peer_prefills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--streams", default="1,16", help="decode stream counts ('' for none)")
    parser.add_argument("--prefill", default="", help="one request's prompt lengths, e.g. 512,2000,4000")
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS,
                        help="each decode stream's prompt length (default 32; the peer's -npp too)")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default chat model)")
    parser.add_argument("--kernels", default="auto", help="engine.kernels for the engine runs (auto, avx2, ...)")
    parser.add_argument("--fusion", choices=["on", "off"], default="on",
                        help="graph fusion in the engine runs (kernels/src/fusion.h; default on)")
    parser.add_argument("--prefill-attention", choices=["ours", "ggml"], default="ours",
                        help="a prompt's attention in the engine runs (accel.set_prefill_attention; "
                             "default ours, as the product's)")
    parser.add_argument("--peer", action="store_true", help="llama-batched-bench beside (decode and prefill)")
    parser.add_argument("--cpu", choices=["native", "avx2"], default="native",
                        help="avx2: both sides run an AVX2-only CPU's code (llama.cpp built without AVX-512 "
                             "for the engine and the peer, our kernels' AVX2 path)")
    parser.add_argument("--graph-reuse", choices=["on", "off"], default="on",
                        help="llama.cpp's reuse of the previous step's graph in the engine runs (default on)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="engine and peer alternating N times: each figure the round of the median "
                             "tok/s (or first-token time), ratios the median of the rounds'")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.prompt_tokens < 1:
        parser.error("--prompt-tokens: at least 1")
    kernels_engine.PROMPT_TOKENS = args.prompt_tokens   # the peer's decode runs after prompts as long
    if args.cpu == "avx2":
        kernels_engine.use_avx2_build()
        args.kernels = "avx2"
    model = kernels_engine.model_path(args.model)
    facts = model_facts(model)
    roof = roofs(args.threads, facts["type"], facts["bytes"])
    runs, peer, peer_prefills = rounds(args)
    streams = sorted(runs["decode"])
    gb = roof["bandwidth"] / 1e9
    print(f"{kernels_engine.cpu_name()}; {os.path.basename(model)} ({facts['type']}); {args.threads} threads; "
          f"engine path {runs['path']}, fusion {args.fusion}, prompts' attention {args.prefill_attention}, "
          f"graph reuse {args.graph_reuse}; decode after {args.prompt_tokens}-token prompts" +
          (", llama.cpp built for AVX2" if args.cpu == "avx2" else "") +
          (f"; medians of {args.rounds} rounds" if args.rounds > 1 else ""))
    print(f"memory roof: {gb:.1f} GB/s reading the weights' {facts['bytes'] / 1e6:.1f} MB ({args.threads} threads; "
          f"{roof['dram'] / 1e9:.1f} GB/s from a {BANDWIDTH_BYTES >> 20} MiB buffer): "
          f"{roof['bandwidth'] / facts['bytes']:.0f} tok/s at one stream at most")
    print("compute roof (our MUL_MAT, {0} x {1} {3}, {2} tokens, in cache): ".format(*PEAK_SHAPE, facts["type"]) +
          ", ".join(f"{path} {peak / 1e9:.0f} G multiply-adds/s" for path, peak in roof["peaks"].items()))
    path_peak = roof["peaks"].get(runs["path"] or "", max(roof["peaks"].values(), default=0.0))
    if streams:
        print("\n| streams | tok/s | ms a step | weights read | of the memory roof | multiply-adds | "
              "of the compute roof |" + (" llama-batched-bench tok/s | ratio |" if peer else ""))
        print("|---|---|---|---|---|---|---|" + ("---|---|" if peer else ""))
    for n in streams:
        w = runs["decode"][n]
        steps = max(w["stats"]["n_steps"], 1)
        tok_s = w["stats"]["n_tokens_sampled"] / w["seconds"]
        read = steps * facts["bytes"] / w["seconds"]
        macs = tok_s * facts["macs"]
        cells = [f"{n}", f"{tok_s:.1f}", f"{1e3 * w['seconds'] / steps:.2f}", f"{read / 1e9:.1f} GB/s",
                 f"{100 * read / roof['bandwidth']:.0f} %", f"{macs / 1e9:.1f} G/s",
                 f"{100 * macs / path_peak:.0f} %" if path_peak else "-"]
        if peer:
            cells += [f"{peer[n]['decode']:.1f}", f"{peer[n]['ratio']:.2f}x"]
        print("| " + " | ".join(cells) + " |")
    for n in streams:
        w = runs["decode"][n]
        steps = max(w["stats"]["n_steps"], 1)
        rows = phase_rows(w, steps)
        at_roof = facts["bytes"] / roof["bandwidth"]
        nodes = w['profile']['nodes'] / max(w['profile']['graph'][1], 1)
        reused = w["stats"].get("n_graphs_reused", 0)
        print_phases(f"A decode step at {n} stream{'s' if n > 1 else ''} ({steps} steps, {reused} on a reused graph; "
                     f"the weights at the memory roof: {at_roof * 1e3:.2f} ms; {nodes:.0f} computing nodes a graph, "
                     f"their barriers and dispatch at {roof['node'] * 1e6:.2f} us a node: "
                     f"{nodes * roof['node'] * 1e3:.2f} ms)", rows)
    for n_tokens, w in sorted(runs["prefill"].items()):
        peer_s = peer_prefills.get(n_tokens)
        head = (f"One request's prompt of {n_tokens} tokens: first token after {w['seconds'] * 1e3:.0f} ms, "
                f"{n_tokens / w['seconds']:.0f} tok/s")
        if peer_s:
            head += (f"; llama-batched-bench's prompt processing {peer_s['seconds'] * 1e3:.0f} ms: "
                     f"**{peer_s['ratio']:.2f}x** its time")
        macs = n_tokens * facts["macs"] / w["seconds"]
        head += f"; {macs / 1e9:.1f} G multiply-adds/s, {100 * macs / path_peak:.0f} % of the compute roof" if path_peak else ""
        print_phases(head, phase_rows(w, 1.0))


if __name__ == "__main__":
    main()
