"""Runs inside the arm64 root, under qemu-aarch64 (tests/image/test_aarch64_wheels.py copies it
there): a two-node tensor split of the default chat model, two aarch64 engine workers on
loopback started as the daemon starts them (runtime/clients.py's WorkerEngine, each on its shard
from cluster/shard.py, the exchange in our kernels), against one aarch64 worker on the whole
model, as tests/engine/test_tensor_e2e.py holds it on x86.

    python aarch64_split.py N_PROMPTS MAX_TOKENS

Prints JSON: the path our kernels chose in each worker (leader, follower, one node), each prompt's greedy text over the
split (twice: run to run) and on one node.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import socket
import sys
import tempfile

from stackd.cluster import shard
from stackd.engine.core import SamplingParams
from stackd.runtime.clients import WorkerEngine
from stackd.runtime.runner import ModelRunner
from stackd.store import defaults

PROMPTS = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea."]
# One thread each: two ranks and one node share the emulator's host cores.
ENGINE = dict(slots=2, context_length=256, batch=64, threads=1)
N_VOCAB = 49152                 # SmolLM2's
DEADLINE_MS = 600_000           # a step under TCG takes what it takes: the follower is not lost


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def greedy() -> SamplingParams:
    sampling = SamplingParams()
    sampling.temperature = 0.0
    return sampling


async def texts(runner: ModelRunner, prompts: list[list[int]], max_tokens: int) -> list[str]:
    out = []
    for prompt in prompts:
        stream = await runner.generate([(prompt, max_tokens, greedy())], [])
        text = b""
        async for event in stream:
            text += event.text
        out.append(text.decode("utf-8", "replace"))
    return out


def bound() -> socket.socket:
    # tests/engine/test_tensor_e2e.py's, again: this script runs in the arm64 root, without the test tree
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener


async def scenario(n_prompts: int, max_tokens: int) -> dict:
    loop = asyncio.get_running_loop()
    _, paths = shard.write_shards(defaults.smollm2_path(), [1.0, 1.0], tempfile.mkdtemp(prefix="shards-"))
    listeners = [bound() for _ in paths]
    group = {"size": 2, "addresses": [["127.0.0.1", s.getsockname()[1]] for s in listeners],
             "mesh_id": secrets.token_hex(8), "secret": secrets.token_hex(32), "deadline_ms": DEADLINE_MS,
             "spin_us": 50, "vocab_cut": shard.vocab_cut(N_VOCAB, [1.0, 1.0])}
    try:
        leader, follower = await asyncio.gather(*[
            WorkerEngine.start(loop, dict(ENGINE, model_path=path, tp_rank=rank, tp_size=2), kernels="auto",
                               tensor=dict(group, rank=rank), listener=listeners[rank])
            for rank, path in enumerate(paths)])
    finally:
        for listener in listeners:
            listener.close()
    runner = ModelRunner(loop, leader)
    try:
        prompts = (await runner.tokenize([chat(p) for p in PROMPTS[:n_prompts]], False, True))
        split = await texts(runner, prompts, max_tokens)
        again = await texts(runner, prompts, max_tokens)
    finally:
        await runner.close()
    follower_status = await loop.run_in_executor(None, follower.proc.wait, 600)
    follower.sock.close()
    alone = await WorkerEngine.start(loop, dict(ENGINE, model_path=defaults.smollm2_path()), kernels="auto")
    runner = ModelRunner(loop, alone)
    try:
        one_node = await texts(runner, prompts, max_tokens)
    finally:
        await runner.close()
    return {"paths": [leader.kernels["path"], follower.kernels["path"], alone.kernels["path"]], "split": split,
            "again": again, "one_node": one_node, "follower_status": follower_status}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(scenario(int(sys.argv[1]), int(sys.argv[2])))))
