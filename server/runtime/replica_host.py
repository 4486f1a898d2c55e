"""The replicas this node runs for its leader (a follower's side of remote_replica.py): each a
full copy of a model from this node's own store, in an engine worker of its own with this node's
kernels, started and stopped when the leader asks, fed over the signed replica stream.

A replica is admitted against what this node offers to models (its memory, less the reserve,
within models.memory_limit_mb, less what it runs already), so memory admission counts each
replica on its node. A follower that loses its leader (fenced) stops its replicas, as it stops
its RPC server children: the leader routes to them no more and will start fresh ones.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ..engine.core import SamplingParams
from ..engine.errors import EngineError, ErrorCode
from ..errors import Code, DomainError, invalid
from .runner import ModelRunner

log = logging.getLogger("stackd.cluster")

MAX_REPLICAS = 16              # replicas one node runs at most (each is a model in memory)
WARM_PROMPT = 32               # tokens of the warm-up request a fresh replica runs before it serves
WARM_TOKENS = 4                # and the tokens it decodes


@dataclass
class Hosted:
    replica_id: str
    model_id: str
    runner: ModelRunner
    memory_bytes: int
    context_length: int
    asked_at: float                # this node's monotonic clock when the leader asked for it


class ReplicaHost:
    def __init__(self, registry):
        self.registry = registry
        self.replicas: dict[str, Hosted] = {}
        self._starting: dict[str, asyncio.Task] = {}

    def placed_here(self) -> int:
        return sum(h.memory_bytes for h in self.replicas.values())

    async def start(self, replica_id: str, model_id: str, sha256: str, context_length: int,
                    kv_type: str | None = None) -> Hosted:
        """Idempotent: the same replica id answers the replica that runs or is starting."""
        if replica_id in self.replicas:
            return self.replicas[replica_id]
        task = self._starting.get(replica_id)
        if task is None:
            if len(self.replicas) + len(self._starting) >= MAX_REPLICAS:
                raise DomainError(Code.UNAVAILABLE, f"this node runs {MAX_REPLICAS} replicas already")
            task = self._starting[replica_id] = asyncio.ensure_future(
                self._start(replica_id, model_id, sha256, context_length, kv_type, time.monotonic()))
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._starting.pop(replica_id, None)

    async def _start(self, replica_id: str, model_id: str, sha256: str, context_length: int,
                     kv_type: str | None, asked_at: float) -> Hosted:
        registry = self.registry
        manifest = registry.manifest(model_id)
        if manifest.sha256 != sha256:
            raise invalid(f"this node's '{model_id}' is another file (sha256 {manifest.sha256[:12]}...)", "sha256")
        if manifest.kind != "chat":
            raise invalid("only chat models run as replicas", "model")
        context = registry.planner.context_for(manifest, context_length)
        registry.planner.admit(manifest, context, kv_type)   # 507 when it does not fit here
        model = await registry.supervisor.start(manifest, context, kv_type=kv_type)
        model.runner.engine.on_lost = lambda client: self._lost(replica_id, client)
        try:
            await warm(model.runner)
        except BaseException:
            await model.runner.close(0)
            raise
        memory = sum(registry.planner.estimate(manifest, context, kv_type).values())
        hosted = Hosted(replica_id, model_id, model.runner, memory, context, asked_at)
        self.replicas[replica_id] = hosted
        return hosted

    def _lost(self, replica_id: str, client) -> None:
        """Its worker died: its streams have their error events; the leader starts another."""
        hosted = self.replicas.get(replica_id)
        if hosted is not None and hosted.runner.engine is client:
            del self.replicas[replica_id]
            asyncio.ensure_future(client.aclose(0))

    def get(self, replica_id: str) -> Hosted:
        hosted = self.replicas.get(replica_id)
        if hosted is None:
            raise EngineError(ErrorCode.WORKER_LOST, f"no replica {replica_id} runs on this node")
        return hosted

    async def stop(self, replica_id: str) -> bool:
        task = self._starting.get(replica_id)
        if task is not None:
            await asyncio.wait([task])
        hosted = self.replicas.pop(replica_id, None)
        if hosted is None:
            return False
        hosted.runner.end_all(EngineError(ErrorCode.UNLOADED, "the replica was stopped"))
        await hosted.runner.close(0)
        return True

    def keep_only(self, listed: set[str], asked_before: float) -> None:
        """The leader holds only the `listed` replicas here (its heartbeat answer, made after
        `asked_before`): one asked for before that and not listed is an orphan (the leader marked
        this node down, restarted, or its replica/stop never came): it stops, as an RPC server
        child does (cluster/rpc_server.py). Newer ones may be too new for the list."""
        for hosted in list(self.replicas.values()):
            if hosted.replica_id not in listed and hosted.asked_at < asked_before:
                log.warning("cluster: the leader no longer holds replica %s of %s: it stops",
                            hosted.replica_id, hosted.model_id)
                asyncio.ensure_future(self.stop(hosted.replica_id))

    def stop_all(self) -> None:
        for replica_id in list(self.replicas):
            asyncio.ensure_future(self.stop(replica_id))

    def offer(self) -> dict:
        return {"store": sorted(m.sha256 for m in self.registry.store.list() if m.kind == "chat"),
                "running": self.listing()}

    def listing(self) -> list[dict]:
        return [{"replica_id": h.replica_id, "model": h.model_id, "pid": h.runner.engine.pid,
                 "memory_bytes": h.memory_bytes} for h in self.replicas.values()]


async def warm(runner: ModelRunner) -> None:
    """One short greedy request through a fresh replica's engine before it is announced: the
    weights are paged in from this node's copy of the file (cold on a node that never read it)
    and the engine's threads and buffers are up, so the first requests the leader routes here
    do not pay for them (bench/cluster.py --replicas: a cold follower's first round ran at
    half the speed of the later ones)."""
    n_vocab = runner.engine.n_vocab
    prompt = [(100 + i) % n_vocab for i in range(WARM_PROMPT)]
    async for _ in await runner.generate([(prompt, WARM_TOKENS, SamplingParams())], []):
        pass
