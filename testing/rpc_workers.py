"""Real ggml RPC servers on loopback (children with their relays, as a follower runs them) and
engine workers placed over them: shared by tests/placement and bench/cluster_pipeline.py."""
from __future__ import annotations

from stackd.cluster.rpc_server import RpcServers
from stackd.engine.core import SamplingParams
from stackd.runtime.clients import WorkerEngine
from stackd.runtime.runner import ModelRunner
from stackd.store import defaults
from .daemon import free_port

SECRET = bytes(range(32))
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Count from one to ten."]


async def chat_prompt(runner: ModelRunner, text: str) -> list[int]:
    """`text` as SmolLM2's chat template renders one user turn, tokenized by the runner."""
    rendered = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return (await runner.tokenize([rendered], False, True))[0]


def engine_params(model_path: str | None = None, **placement) -> dict:
    return dict(model_path=model_path or defaults.smollm2_path(), slots=4, context_length=256, batch=64,
                threads=1, **placement)


async def start_worker(loop, params: dict, rpc: dict | None = None, kernels: str = "off") -> ModelRunner:
    client = await WorkerEngine.start(loop, params, kernels=kernels, rpc=rpc)
    return ModelRunner(loop, client)


async def generate(runner: ModelRunner, text: str, max_tokens: int = 24, n_top: int = 0) -> dict:
    sampling = SamplingParams()
    sampling.temperature = 0.0
    if n_top:
        sampling.logprobs = True
        sampling.n_top_logprobs = n_top
    stream = await runner.generate([(await chat_prompt(runner, text), max_tokens, sampling)], [])
    out = {"text": b"", "logprobs": [], "error": None}
    async for event in stream:
        out["text"] += event.text
        out["logprobs"] += event.logprobs or []
        if event.error:
            out["error"] = event.error
    return out


class Peers:
    """RPC server children on loopback, one per simulated follower, each behind its relay."""

    def __init__(self, loop, data_dir: str, kernels: str = "off"):
        self.loop = loop
        self.servers = RpcServers(loop, data_dir, "127.0.0.1", 0, SECRET, kernels=kernels)
        self.n = 0

    async def start(self, direct: bool = False, kernels: str | None = None):
        """A child; `kernels` (engine.kernels or a path name) for this one only."""
        self.n += 1
        default, self.servers.kernels = self.servers.kernels, kernels or self.servers.kernels
        self.servers.first_port = 0 if direct else free_port()
        try:
            return await self.servers.start(f"test-{self.n}", 1, "leader", direct=direct)
        finally:
            self.servers.kernels = default

    def rpc(self, children) -> dict:
        return {"secret": SECRET.hex(), "peers": [
            {"host": "127.0.0.1", "port": c.port, "relay": not c.direct, "placement_id": c.placement_id}
            for c in children]}
