"""The tensor-split shards this node runs for its leader (a follower's side of tensor_group.py).

Each is an engine worker of its own on this node's shard of a model, cut from the file this
node's store holds (the same sha256 as the leader's, checked), in lockstep with the leader's
worker: it mirrors the leader's decode steps and cache operations, exchanges partial sums with
every peer inside each step, and never samples (docs/cluster.md, "Tensor parallelism").

A start answers as soon as the worker is spawned and its mesh listener bound: the leader's own
worker, started after every follower answered, completes the mesh, and only then do the
engines load, so waiting here for a load would wait for the leader. A worker whose group ends
(the leader's stop, a lost link) exits, and this node forgets it. A follower fenced off from its
leader, or not listed in the leader's heartbeat answers any more, stops it (keep_only), as it
stops its RPC server children and replicas.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass

from ..engine.wire import FrameReader
from ..errors import Code, DomainError, invalid
from .clients import send_start
from .worker_process import spawn

log = logging.getLogger("stackd.cluster")

MAX_GROUPS = 8                  # tensor shards one node runs at once
STOP_GRACE = 5.0                # seconds a stopped follower has to exit before it is killed
# What the leader's engine parameters may say, with their types: a follower runs the same
# context (slots, context length, batch, cache type) so that every step fits both.
ENGINE_FIELDS = {"slots": int, "context_length": int, "batch": int, "max_queue": int, "flash_attn": int,
                 "key_share": float, "speculative_draft_max": int, "speculative_step_tokens": int,
                 "kv_type": int, "embeddings": bool}


@dataclass
class Follower:
    group_id: str
    model_id: str
    rank: int
    proc: subprocess.Popen
    sock: socket.socket
    port: int
    asked_at: float
    watcher: asyncio.Task | None = None


class TensorHost:
    def __init__(self, registry, host: str = "127.0.0.1"):
        self.registry = registry
        self.host = host                 # the address peers dial (the node's, ClusterLinks.bind_host)
        self.followers: dict[str, Follower] = {}

    async def start(self, group_id: str, model_id: str, sha256: str, rank: int, weights: list[float],
                    addresses: list[list], engine: dict, tensor: dict) -> Follower:
        """Idempotent on the group id. `addresses`: the lower ranks' (host, port), which this
        rank dials; `engine`: the leader's engine parameters (ENGINE_FIELDS); `tensor`: the
        group's deadline_ms, spin_us, vocab_cut, mesh_id and secret."""
        if group_id in self.followers:
            return self.followers[group_id]
        if len(self.followers) >= MAX_GROUPS:
            raise DomainError(Code.UNAVAILABLE, f"this node runs {MAX_GROUPS} tensor shards already")
        registry = self.registry
        manifest = registry.manifest(model_id)
        if manifest.sha256 != sha256:
            raise invalid(f"this node's '{model_id}' is another file (sha256 {manifest.sha256[:12]}...)", "sha256")
        if not 0 < rank < len(weights) or len(addresses) != rank:
            raise invalid("'rank' must be a follower's place among 'weights', after the ranks of 'addresses'", "rank")
        params = {name: kind(engine[name]) for name, kind in ENGINE_FIELDS.items() if name in engine}
        if params.get("embeddings"):
            raise invalid("embedding models are not split", "engine")
        from ..cluster.shard import ShardError, shard_for      # numpy and gguf: on demand, not at start
        path = registry.store.model_path(manifest)
        cache = shard_cache(registry.store)
        try:
            shard = await asyncio.get_running_loop().run_in_executor(
                None, shard_for, path, weights, rank, cache, manifest.sha256)
        except ShardError as exc:
            raise invalid(f"the model cannot be cut so: {exc}", "weights") from None
        config = registry.supervisor.config
        params.update(model_path=shard, threads=config.threads, tp_rank=rank, tp_size=len(weights))
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, 0))
            listener.listen(16)
            port = listener.getsockname()[1]
            message = {"op": "start", "engine": params, "kernels": config.kernels, "kv_commit": config.kv_commit,
                       "batch_invariant": config.batch_invariant, "nice": 0, "rpc": None,
                       "faults": registry.supervisor.faults.for_worker()}
            secret = getattr(registry.cluster.membership, "secret", None) or b""
            # the higher ranks dial this one: their addresses are never used here (not known yet)
            higher = [[self.host, 0]] * (len(weights) - rank - 1)
            group = {**tensor, "secret": secret.hex(), "rank": rank, "size": len(weights),
                     "addresses": [list(a) for a in addresses] + [[self.host, port]] + higher}
            proc, ours = spawn(config.omp_wait_policy_for(False))
            try:
                await send_start(asyncio.get_running_loop(), ours, message, group, listener)
            except BaseException:
                ours.close()
                proc.kill()
                proc.wait()
                raise
        finally:
            listener.close()             # the worker holds its own copy
        follower = Follower(group_id, model_id, rank, proc, ours, port, time.monotonic())
        follower.watcher = asyncio.ensure_future(self._watch(follower))
        self.followers[group_id] = follower
        log.info("cluster: tensor shard %d of %d of %s for group %s (pid %d, mesh port %d)",
                 rank, len(weights), model_id, group_id, proc.pid, port)
        return follower

    async def _watch(self, follower: Follower) -> None:
        """Until the worker's socket ends: its frames are its ready word and nothing after."""
        loop, reader = asyncio.get_running_loop(), FrameReader()
        try:
            while True:
                data = await loop.sock_recv(follower.sock, 1 << 16)
                if not data:
                    break
                for message, _ in reader.feed(data):
                    if message.get("op") != "ready":
                        log.warning("cluster: tensor shard of group %s: %s", follower.group_id,
                                    message.get("error") or message.get("op"))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            follower.sock.close()
            status = await loop.run_in_executor(None, _reap, follower.proc)
            if self.followers.get(follower.group_id) is follower:
                del self.followers[follower.group_id]
            log.info("cluster: tensor shard of group %s ended (exit %s)", follower.group_id, status)

    async def stop(self, group_id: str) -> bool:
        follower = self.followers.pop(group_id, None)
        if follower is None:
            return False
        if follower.proc.poll() is None:
            follower.proc.terminate()
        if follower.watcher is not None:
            await asyncio.wait([follower.watcher])
        return True

    def keep_only(self, listed: set[str], asked_before: float) -> None:
        """The leader holds only the `listed` groups here (its heartbeat answer, made after
        `asked_before`): one asked for before that and not listed is an orphan, and stops."""
        for follower in list(self.followers.values()):
            if follower.group_id not in listed and follower.asked_at < asked_before:
                log.warning("cluster: the leader no longer holds tensor group %s: its shard stops",
                            follower.group_id)
                asyncio.ensure_future(self.stop(follower.group_id))

    def stop_all(self) -> None:
        for group_id in list(self.followers):
            asyncio.ensure_future(self.stop(group_id))

    def listing(self) -> list[dict]:
        return [{"group_id": f.group_id, "model": f.model_id, "rank": f.rank, "pid": f.proc.pid,
                 "port": f.port} for f in self.followers.values()]


def shard_cache(store) -> str:
    """Where a node keeps the shards it cut: beside its store (data_dir/shards)."""
    return os.path.join(os.path.dirname(store.root), "shards")


def _reap(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
