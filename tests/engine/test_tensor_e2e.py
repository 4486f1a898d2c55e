"""A tensor split end to end through the engine: two real engine workers (server/engine/worker.py,
started as the daemon starts them: runtime/clients.py's WorkerEngine, the mesh listener passed as
a descriptor after the start frame) on the two shards of the default model (cluster/shard.py),
rank 0 serving generation requests through the engine API (runtime/runner.py) while rank 1
follows its steps (native/engine/lockstep.h) and the kernels exchange partial sums and logits
(kernels/src/tp.h). Against one worker on the whole model:

- greedy text deterministic run to run over the split;
- greedy text equal to one node's on every prompt, and the first token's top-5 log-probabilities
  within LOGPROB_NATS of one node's (0 measured): the products a split cuts by input columns run in
  the kernels' chunked form on one node as on the split (kernels/src/kernels.h, GemmOut), so a
  split adds what one node adds, up to double rounding;
- n > 1 (two seeded choices of one request) and logprobs over the split;
- the follower killed or frozen (SIGSTOP) mid-stream: the leader's request ends with the lost-node
  error (WORKER_LOST, 503), the leader exits EXIT_TENSOR_PEER_LOST, nothing hangs; the leader
  killed: the follower exits EXIT_TENSOR_PEER_LOST.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket

import pytest

from stackd.cluster import shard
from stackd.engine import accel
from stackd.engine.core import STATUS_ERROR, STATUS_RUNNING, SamplingParams
from stackd.engine.errors import ErrorCode
from stackd.engine.worker import EXIT_TENSOR_PEER_LOST
from stackd.runtime.clients import WorkerEngine
from stackd.runtime.runner import ModelRunner
from stackd.store import defaults

pytestmark = pytest.mark.skipif(not accel.cpu_supports("avx2"), reason="the exchanges run inside our kernels")

PROMPTS = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea.",
           "What is 17 times 23?", "Why is the sky blue?", "Give me a tip for learning to cook."]
LOGPROB_NATS = 0.02             # the bound on the first token's top-5 log-probabilities
MAX_TOKENS = 32
ENGINE = dict(slots=4, context_length=256, batch=64, threads=1)
DEADLINE_MS = 2000
N_VOCAB = 49152                 # SmolLM2's
N_EMBD = 576


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    _, paths = shard.write_shards(defaults.smollm2_path(), [1.0, 1.0], str(tmp_path_factory.mktemp("tp-shards")))
    return paths


def bound() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener


async def start_group(shards: list[str], **engine) -> tuple[WorkerEngine, WorkerEngine]:
    """Both ranks' workers, started as tensor_group.py / tensor_host.py start them."""
    loop = asyncio.get_running_loop()
    listeners = [bound() for _ in shards]
    addresses = [["127.0.0.1", s.getsockname()[1]] for s in listeners]
    group = {"size": len(shards), "addresses": addresses, "mesh_id": secrets.token_hex(8),
             "secret": secrets.token_hex(32), "deadline_ms": DEADLINE_MS, "spin_us": 50,
             "vocab_cut": shard.vocab_cut(N_VOCAB, [1.0] * len(shards))}
    try:
        starts = [WorkerEngine.start(loop, dict(ENGINE, model_path=path, tp_rank=rank, tp_size=len(shards), **engine),
                                     kernels="auto", tensor=dict(group, rank=rank), listener=listeners[rank])
                  for rank, path in enumerate(shards)]
        return tuple(await asyncio.wait_for(asyncio.gather(*starts), 180))
    finally:
        for listener in listeners:
            listener.close()            # the workers hold their own copies


async def one_node() -> WorkerEngine:
    return await WorkerEngine.start(asyncio.get_running_loop(), dict(ENGINE, model_path=defaults.smollm2_path()),
                                    kernels="auto")


def greedy(**fields) -> SamplingParams:
    sampling = SamplingParams()
    sampling.temperature = 0.0
    for name, value in fields.items():
        setattr(sampling, name, value)
    return sampling


async def answer(runner: ModelRunner, prompt: list[int], n: int = 1, sampling=None, max_tokens=MAX_TOKENS):
    """Each choice's text, its last event and all its events."""
    stream = await runner.generate([(prompt, max_tokens, sampling or greedy())] * n, [])
    choices = [{"text": b"", "events": []} for _ in range(n)]
    async for event in stream:
        choice = choices[stream.choice[event.id_request]]
        choice["text"] += event.text
        choice["events"].append(event)
    return choices


async def texts(runner: ModelRunner, prompts: list[list[int]]) -> list[bytes]:
    return [(await answer(runner, p))[0]["text"] for p in prompts]


def test_a_tensor_split_serves_as_one_node(shards):
    async def scenario():
        leader, follower = await start_group(shards)
        runner = ModelRunner(asyncio.get_running_loop(), leader)
        try:
            prompts = await runner.tokenize([chat(p) for p in PROMPTS], False, True)
            first = await texts(runner, prompts)
            second = await texts(runner, prompts)
            choices = await answer(runner, prompts[2], n=2, sampling=greedy(temperature=0.8, seed=7))
            scored = (await answer(runner, prompts[0], sampling=greedy(logprobs=True, n_top_logprobs=5)))[0]
        finally:
            await runner.close()
        follower_status = await asyncio.get_running_loop().run_in_executor(None, follower.proc.wait, 60)
        follower.sock.close()
        alone = await one_node()
        runner = ModelRunner(asyncio.get_running_loop(), alone)
        try:
            want = await texts(runner, prompts)
            want_scored = (await answer(runner, prompts[0], sampling=greedy(logprobs=True, n_top_logprobs=5)))[0]
        finally:
            await runner.close()
        return first, second, choices, scored, follower_status, want, want_scored

    first, second, choices, scored, follower_status, want, want_scored = asyncio.run(scenario())
    assert first == second                                   # deterministic run to run
    assert all(first)
    equal = sum(a == b for a, b in zip(first, want))
    print(f"greedy texts equal to one node's: {equal} of {len(PROMPTS)}")
    assert equal == len(PROMPTS)
    assert all(c["text"] and c["events"][-1].status != STATUS_ERROR for c in choices)   # n > 1
    entries = [e for ev in scored["events"] for e in (ev.logprobs or [])]
    want_entries = [e for ev in want_scored["events"] for e in (ev.logprobs or [])]
    assert entries and len(entries[0][3]) == 5
    assert entries[0][0] == want_entries[0][0]               # the first token
    gap = max(abs(a[1] - b[1]) for a, b in zip(entries[0][3], want_entries[0][3]))
    print(f"first token's top-5 logprobs: largest gap to one node's {gap:.4f} nats")
    assert gap <= LOGPROB_NATS
    assert follower_status == 0                             # the leader's close stopped it


def finished(stats: dict) -> int:
    return sum(stats.get(k, 0) for k in ("n_finished_stop", "n_finished_length", "n_errors", "n_cancelled"))


async def on_path(leader: WorkerEngine, runner: ModelRunner, prompt: list[int], **fields):
    """One greedy-based request (fields over greedy()); -> (its text, its logprob entries, the
    leader's decodes with rows gathered whole and as candidates meanwhile, its bytes meanwhile)."""
    before = leader.stats()
    choice = (await answer(runner, prompt, sampling=greedy(**fields)))[0]
    assert choice["events"][-1].status != STATUS_ERROR, choice["events"][-1].error
    after = before
    for _ in range(200):                 # the worker pushes its stats after the request's end
        after = leader.stats()
        if finished(after) > finished(before):
            break
        await asyncio.sleep(0.05)
    assert finished(after) > finished(before), "the leader's stats never came"
    delta = {k: after[k] - before.get(k, 0) for k in ("n_tp_gather_full", "n_tp_gather_candidates",
                                                     "tensor_exchange_bytes", "n_generation_tokens",
                                                     "n_tokens_decoded")}
    # What the leader counted beyond the partial sums: the control messages, the frames' headers
    # and tags, and the logits' gather. Without drafts each step has one output row, and a step's
    # partial sums are 576 doubles a batch token at 58 exchanges, a row's at the last layer's two
    # (llama.cpp computes the last layer for the output rows only).
    steps = delta["n_tp_gather_full"] + delta["n_tp_gather_candidates"]
    delta["gather_bytes"] = delta["tensor_exchange_bytes"] - (delta["n_tokens_decoded"] * 58 + steps * 2) * N_EMBD * 8
    entries = [e for ev in choice["events"] for e in (ev.logprobs or [])]
    return choice["text"], entries, delta


def test_the_candidates_path_answers_as_the_full_rows_do(shards, capsys):
    """Greedy, top-k sampling (with top-p, min-p) and a negative logit_bias that bans the top
    token take the candidates path (each follower's top K a row) and give, token for token, what
    the same split gives with its rows whole (logprobs asked: the full path, which changes no
    pick); grammar, logprobs, penalties, a positive bias, top_k over 64 or none take the full rows."""
    async def scenario():
        leader, follower = await start_group(shards, speculative_draft_max=0)   # a row a step (the bytes)
        runner = ModelRunner(asyncio.get_running_loop(), leader)
        out = {"same": [], "paths": {}}
        try:
            prompts = await runner.tokenize([chat(p) for p in PROMPTS[:3]], False, True)
            sampled = dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, seed=7)
            for prompt in prompts:
                for fields in ({}, sampled):
                    fast, _, d_fast = await on_path(leader, runner, prompt, **fields)
                    whole, entries, d_whole = await on_path(leader, runner, prompt, logprobs=True, **fields)
                    out["same"].append((fast, whole))
                    out["paths"].setdefault("greedy" if not fields else "top-k", []).append((d_fast, d_whole))
            # the top token banned: the next best is still among each follower's candidates
            _, entries, _ = await on_path(leader, runner, prompts[0], logprobs=True)
            top = entries[0][0]
            banned = dict(logit_bias=[(top, -100.0)])
            fast, _, d_fast = await on_path(leader, runner, prompts[0], **banned)
            whole, entries, d_whole = await on_path(leader, runner, prompts[0], logprobs=True, **banned)
            out["banned"] = (top, fast, whole, entries[0][0], d_fast, d_whole)
            schema = 'root ::= "The answer is " [a-z]+ "."'
            for name, fields in (("grammar", dict(grammar=schema)), ("top logprobs", dict(logprobs=True, n_top_logprobs=2)),
                                 ("repeat penalty", dict(repeat_penalty=1.1)),
                                 ("positive bias", dict(logit_bias=[(top, 0.5)])),
                                 ("top_k 65", dict(temperature=0.8, top_k=65, seed=1)),
                                 ("no top_k", dict(temperature=0.8, seed=1)),
                                 ("top_k 64", dict(temperature=0.8, top_k=64, seed=1)),
                                 ("greedy, min_tokens", dict(min_tokens=4))):
                out["paths"][name] = (await on_path(leader, runner, prompts[1], **fields))[2]
        finally:
            await runner.close()
        await asyncio.get_running_loop().run_in_executor(None, follower.proc.wait, 60)
        follower.sock.close()
        return out

    out = asyncio.run(scenario())
    for fast, whole in out["same"]:
        assert fast and fast == whole
    for name in ("greedy", "top-k"):
        for d_fast, d_whole in out["paths"][name]:
            assert d_fast["n_tp_gather_candidates"] > 0 and d_fast["n_tp_gather_full"] == 0, (name, d_fast)
            assert d_whole["n_tp_gather_full"] > 0 and d_whole["n_tp_gather_candidates"] == 0, (name, d_whole)
            # a row whole is 24,576 floats (96 KiB) from the follower; candidates 8 bytes each (at
            # most 40 here), a step's 61 frames' headers and tags 36 bytes each, a control message
            # 45 bytes and 13 a batch token
            assert d_whole["gather_bytes"] >= d_whole["n_tp_gather_full"] * 96 * 1024, (name, d_whole)
            assert 0 < d_fast["gather_bytes"] <= d_fast["n_tp_gather_candidates"] * 3 * 1024 + \
                d_fast["n_tokens_decoded"] * 16, (name, d_fast)
    top, fast, whole, first, d_fast, d_whole = out["banned"]
    assert fast and fast == whole and first != top
    assert d_fast["n_tp_gather_candidates"] > 0 and d_fast["n_tp_gather_full"] == 0
    expected_full = {"grammar", "top logprobs", "repeat penalty", "positive bias", "top_k 65", "no top_k"}
    for name, d in out["paths"].items():
        if name in ("greedy", "top-k"):
            continue
        if name in expected_full:
            assert d["n_tp_gather_full"] > 0 and d["n_tp_gather_candidates"] == 0, (name, d)
        else:
            assert d["n_tp_gather_candidates"] > 0 and d["n_tp_gather_full"] == 0, (name, d)
    d_fast, d_whole = out["paths"]["greedy"][0]
    with capsys.disabled():
        print(f"\nthe gather and control, a generated token (the leader's count beyond the partial sums): "
              f"candidates {d_fast['gather_bytes'] / d_fast['n_generation_tokens'] / 1024:.1f} KiB, rows whole "
              f"{d_whole['gather_bytes'] / d_whole['n_generation_tokens'] / 1024:.1f} KiB")


async def stream_until(runner: ModelRunner, fault, n_before: int = 2) -> list:
    """A long greedy answer; `fault()` once `n_before` events came. Its events, to its end."""
    prompt = (await runner.tokenize([chat("Count from one to one hundred in words.")], False, True))[0]
    stream = await runner.generate([(prompt, 200, greedy())], [])
    events = []

    async def drain():
        async for event in stream:
            events.append(event)
            if len(events) == n_before and event.status == STATUS_RUNNING:
                fault()

    await asyncio.wait_for(drain(), 60)               # never a hang
    return events


async def lose_mid_stream(shards, victim, signal_number: int, survivor):
    """A group streaming one request; victim(leader, follower)'s pid gets signal_number after the
    first tokens; -> (the request's events, survivor(leader, follower)'s exit status)."""
    loop = asyncio.get_running_loop()
    leader, follower = await start_group(shards)
    runner = ModelRunner(loop, leader)
    try:
        events = await stream_until(runner, lambda: os.kill(victim(leader, follower), signal_number))
        status = await loop.run_in_executor(None, survivor(leader, follower).wait, 30)
    finally:
        await runner.close(0)
        follower.proc.kill()
        follower.proc.wait()
        follower.sock.close()
    return events, status


@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_follower_lost_mid_stream_ends_the_leaders_request(shards, signal_number):
    """Killed, its link closes; frozen, the exchange's deadline passes: either way the request
    ends with the lost-node error and the leader's worker exits EXIT_TENSOR_PEER_LOST."""
    events, status = asyncio.run(lose_mid_stream(shards, lambda leader, follower: follower.proc.pid,
                                                 signal_number, lambda leader, follower: leader.proc))
    last = events[-1]
    assert last.status == STATUS_ERROR and last.error.code is ErrorCode.WORKER_LOST
    assert sum(e.n_tokens for e in events) < 200
    assert status == EXIT_TENSOR_PEER_LOST


def test_the_leader_lost_mid_stream_ends_the_follower(shards):
    events, status = asyncio.run(lose_mid_stream(shards, lambda leader, follower: leader.proc.pid,
                                                 signal.SIGKILL, lambda leader, follower: follower.proc))
    assert events[-1].status == STATUS_ERROR and events[-1].error.code is ErrorCode.WORKER_LOST
    assert status == EXIT_TENSOR_PEER_LOST


def test_a_follower_lost_between_requests_ends_the_leader(shards):
    """No request in flight: the idle leader's keepalive finds the link gone, and its worker
    exits EXIT_TENSOR_PEER_LOST, so the daemon places the model again before anyone asks."""
    async def scenario():
        loop = asyncio.get_running_loop()
        leader, follower = await start_group(shards)
        runner = ModelRunner(loop, leader)
        try:
            prompt = (await runner.tokenize([chat("Name three colors.")], False, True))[0]
            answered = await answer(runner, prompt)
            follower.proc.kill()
            status = await loop.run_in_executor(None, leader.proc.wait, 30)
        finally:
            await runner.close(0)
            follower.proc.wait()
            follower.sock.close()
        return answered, status

    answered, status = asyncio.run(scenario())
    assert answered[0]["text"] and answered[0]["events"][-1].status != STATUS_ERROR
    assert status == EXIT_TENSOR_PEER_LOST


@pytest.mark.parametrize("change, words", [
    (dict(kernels="off"), "needs our kernels"),
    (dict(tensor=dict(vocab_cut=[0, N_VOCAB])), "do not agree on its size"),
    (dict(tensor=dict(secret="zz")), "non-hexadecimal"),
], ids=["kernels-off", "cut-of-one", "bad-secret"])
def test_a_worker_refuses_a_tensor_start_it_cannot_run(shards, change, words):
    async def scenario():
        listener = bound()
        group = {"rank": 0, "size": 2, "addresses": [["127.0.0.1", listener.getsockname()[1]], ["127.0.0.1", 1]],
                 "mesh_id": "m", "secret": secrets.token_hex(32), "deadline_ms": DEADLINE_MS, "spin_us": 0,
                 "vocab_cut": shard.vocab_cut(N_VOCAB, [1.0, 1.0]), **change.get("tensor", {})}
        try:
            await WorkerEngine.start(asyncio.get_running_loop(), dict(ENGINE, model_path=shards[0], tp_rank=0, tp_size=2),
                                     kernels=change.get("kernels", "auto"), tensor=group, listener=listener)
        finally:
            listener.close()

    with pytest.raises(RuntimeError, match=words):
        asyncio.run(scenario())
