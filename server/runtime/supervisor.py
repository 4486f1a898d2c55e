"""Worker lifecycles: starting a model's engine (in a worker process, or inline), and keeping it
running: a worker that dies is restarted with backoff, a model that loses a node of its
placement is placed again on the nodes left. It holds no model state of the registry's: it
supervises the models the registry puts into service (`supervise`) and reports each exit and
outcome as a typed event (lifecycle.py) to the callback it was built with.

Supervision of worker processes: a first crash restarts at once (one lost worker should cost its
clients no more than a model load); a crash loop backs off 1 s, 2 s, 4 s ... at most 60 s; after
CRASH_LIMIT crashes within CRASH_WINDOW the model is left `failed` (with the last exit) until
loaded again.
"""
from __future__ import annotations

import asyncio
import os
import time

from ..cluster.placement import Placement
from ..cluster.rpc_devices import NodeUnreachable, PlacementLedger, RpcDevices
from ..engine import accel
from ..engine.config import EngineConfig
from ..engine.core import Engine
from ..engine.errors import EngineError, ErrorCode
from ..errors import DomainError
from ..faults import NONE as NO_FAULTS, Faults
from ..store.store import Manifest, ModelStore
from .clients import InlineEngine, WorkerEngine, describe_exit, exit_record
from .lifecycle import ClusterLinks, Exited, Failed, ModelLocks, Report, Restarted, Restarting, Unplaced
from .loaded_model import LoadedModel
from .planner import Planner
from .worker_process import SpareWorker
from .prompt_cache import PromptCacheConfig
from .runner import ModelRunner
from .tensor_group import TensorGroups

RESTART_BACKOFF_MAX = 60.0
CRASH_LIMIT = 5
CRASH_WINDOW = 300.0
# Placing a model again after a node loss: a node that died may still count as up until its
# heartbeats are missed (3 s), so a failed attempt is retried, without the nodes that refused.
REPLACE_ATTEMPTS = 4
REPLACE_PAUSE = 1.5


def restart_delay(n_crashes: int) -> float:
    """Seconds to wait before restarting a worker that crashed n_crashes times in the window."""
    return 0.0 if n_crashes <= 1 else min(RESTART_BACKOFF_MAX, 2.0 ** (n_crashes - 2))


class Supervisor:
    def __init__(self, loop: asyncio.AbstractEventLoop, store: ModelStore, config: EngineConfig,
                 planner: Planner, locks: ModelLocks, report: Report, cluster: ClusterLinks = ClusterLinks(),
                 faults: Faults = NO_FAULTS, spare: SpareWorker | None = None,
                 prompt_cache: PromptCacheConfig = PromptCacheConfig()):
        self.loop = loop
        self.store = store
        self.config = config
        self.planner = planner          # where a model that lost a node goes now
        self.locks = locks              # shared with the registry: a restart is a transition too
        self.report = report            # each exit and outcome, as a lifecycle event
        self.cluster = cluster
        self.faults = faults            # a test configuration's fault injection (server/faults.py)
        self.spare = spare              # a worker spawned at boot, for the first local load
        self.placements = PlacementLedger()          # what RPC servers and tensor shards it holds
        self.supervised: dict[str, LoadedModel] = {}  # id -> the model in service whose worker it keeps
        self.crashes: dict[str, list[float]] = {}    # id -> monotonic crash times
        self.compute_scale = 1.0                     # the power contract's share
        self.closing = False
        self.prompt_cache = prompt_cache             # where its engines keep prompts on disk (off: none)

    # ---- starting ------------------------------------------------------------------------------

    async def start(self, manifest: Manifest, context: int, placement: Placement | None = None,
                    kv_type: str | None = None):
        """A running engine for the model: (LoadedModel fields) runner, template, placement id,
        max input, KV cache type (`kv_type`, else engine.kv_type). Not yet supervised: the
        registry puts it into service (`supervise`)."""
        config = self.config
        path = self.store.model_path(manifest)
        embeddings = manifest.kind == "embedding"
        kv_type = "f16" if embeddings else (kv_type or config.kv_type)     # as params() has it
        params = config.params(path, embeddings, context, kv_type)
        params.update(self.prompt_cache.params(manifest.sha256, manifest.kind, config))

        def chat_template(facts: dict):
            if embeddings:
                return None
            from ..chat.templates import template_for, warm
            template = template_for(facts)
            warm(template)                                # its first render, before a request's
            return template

        placement_id = None
        if config.isolation == "inline" and placement is None:
            def construct():
                accel.commit_on_write(config.kv_commit)
                accel.register(config.kernels, config.batch_invariant)   # this process runs the engine
                engine = InlineEngine(Engine(**accel.keyed(params)))
                return engine, chat_template(engine.template_facts)
            client, template = await self.loop.run_in_executor(None, construct)
        else:                                              # over RPC always a worker: a lost peer aborts
            rpc = tensor = listener = None
            if placement is not None and placement.split_mode == "tensor":
                placement_id, shard, tensor, listener = await self._tensor_groups().start(
                    placement, manifest, path, params)
                params.update(model_path=shard, tp_rank=0, tp_size=len(placement.shares))
            elif placement is not None:
                placement_id, rpc, split = await self._devices().start(placement, manifest.n_layer)
                params.update(split)
            try:
                policy = config.omp_wait_policy_for(embeddings)
                client = await WorkerEngine.start(self.loop, params, kernels=config.kernels,
                                                  kv_commit=config.kv_commit,
                                                  batch_invariant=config.batch_invariant,
                                                  omp_wait_policy=policy,
                                                  nice=config.embedding_nice if embeddings else 0, rpc=rpc,
                                                  faults=self.faults.for_worker(),
                                                  process=self.spare and self.spare.take(policy),
                                                  tensor=tensor, listener=listener)
            except BaseException:
                if placement is not None:
                    await self.stop_rpc(placement, placement_id)
                raise
            finally:
                if listener is not None:
                    listener.close()                      # the worker holds its own copy
            try:             # compiling a template takes milliseconds: off the loop
                template = await self.loop.run_in_executor(None, chat_template, client.template_facts)
            except BaseException:
                await client.aclose()
                raise
            client.on_lost = self._worker_lost
        if self.compute_scale < 1.0:
            client.set_compute_scale(self.compute_scale)
        model = LoadedModel(manifest, ModelRunner(self.loop, client), context, int(time.time()),
                            kv_type=kv_type, template=template, placement=placement, placement_id=placement_id)
        if embeddings:
            model.max_input = min(client.n_ctx_train, context) if context else client.n_ctx_train
        return model

    def _devices(self) -> RpcDevices:
        return RpcDevices(self.cluster.membership, self.cluster.rpc, self.config.threads or (os.cpu_count() or 1),
                          self.placements)

    def _tensor_groups(self) -> TensorGroups:
        return TensorGroups(self.cluster.membership, self.store, self.placements, self.cluster.bind_host)

    def supervise(self, model: LoadedModel) -> None:
        """`model` serves its id from now on: its worker's exit restarts it (or places it again)."""
        self.supervised[model.id] = model

    def forget_crashes(self, model_id: str) -> None:
        """A load or an unload starts the model's crash count afresh."""
        self.crashes.pop(model_id, None)

    def shutting_down(self) -> None:
        """From now on a worker's exit is the shutdown's, never restarted."""
        self.closing = True

    async def stop_rpc(self, placement: Placement | None, placement_id: str | None) -> None:
        """Free what a placement holds on other nodes: RPC servers, or tensor shards."""
        if placement is None or placement_id is None:
            return
        if placement.split_mode == "tensor":
            await self._tensor_groups().stop(placement.node_ids, placement_id)
        else:
            await self._devices().stop(placement.node_ids, placement_id)

    async def stop(self, model: LoadedModel) -> None:
        """No longer supervised: close the model's engine and free what its placement holds on
        other nodes."""
        if self.supervised.get(model.id) is model:
            del self.supervised[model.id]
        await model.runner.close()
        await self.stop_rpc(model.placement, model.placement_id)

    def set_compute_scale(self, scale: float, models) -> None:
        """The power contract's share of full compute, for every engine now and later."""
        self.compute_scale = scale
        for model in models:
            model.runner.engine.set_compute_scale(scale)

    # ---- a worker died ---------------------------------------------------------------------------

    def _worker_lost(self, client) -> None:
        """A worker died (its socket reached EOF; its requests have their error events)."""
        for model in self.supervised.values():
            if model.replicas is not None and model.replicas.local.runner.engine is client and not self.closing:
                # one replica of several: the others serve on while this one restarts; a set
                # of one is `restarting` (from now on, as below)
                alone = all(r is model.replicas.local for r in model.replicas.live())
                self.report(Restarting(model.id, self.loop.create_task(
                    self._restart_local_replica(model, client.exit_status, alone)), alone))
                return
            if model.runner.engine is client and not self.closing:
                # restarting from now on, not after a hop of the task: its requests have their
                # error events already, and a client that asks at once must not see "loaded"
                if model.placement is not None:
                    restart = self._replace(model, client.exit_status)
                else:
                    restart = self._restart(model, client.exit_status)
                self.report(Restarting(model.id, self.loop.create_task(restart)))
                return

    def record_crash(self, model_id: str, status, reason: str | None = None) -> tuple[int, str]:
        """Count a crash in the window and report the exit: (crashes in the window, its reason)."""
        now = time.monotonic()
        recent = [t for t in self.crashes.get(model_id, []) if now - t < CRASH_WINDOW] + [now]
        self.crashes[model_id] = recent
        record = exit_record(status)
        if reason is not None:
            record["reason"] = reason
        self.report(Exited(model_id, record))
        return len(recent), record["reason"]

    def _serves(self, model: LoadedModel) -> bool:
        """Still the model in service for its id (not unloaded, failed or reloaded meanwhile)."""
        return self.supervised.get(model.id) is model and not self.closing

    def _fail(self, model: LoadedModel, why: str) -> None:
        if self.supervised.get(model.id) is model:
            del self.supervised[model.id]
        self.report(Failed(model.id, why))

    async def _restart(self, model: LoadedModel, status) -> None:
        model.runner.end_all(EngineError(ErrorCode.WORKER_LOST, f"the model's worker process died "
                                         f"({describe_exit(status)})"))
        await model.runner.engine.aclose(0)               # reaped already: frees the socket
        n_crashes, reason = self.record_crash(model.id, status)
        restarts = model.restarts

        def use(fresh) -> None:
            fresh.restarts = restarts + 1
            self.supervised[model.id] = fresh
            self.report(Restarted(model.id, fresh))
        n_crashes, reason = await self._start_again(model, n_crashes, reason, lambda: True, use)
        if n_crashes:
            self._fail(model, self._crash_loop(reason, n_crashes))

    async def _restart_local_replica(self, model: LoadedModel, status, alone: bool) -> None:
        """The leader's own replica died: its requests that had no event yet went to the other
        replicas; it restarts (with the crash backoff) and takes requests again. `alone`: it
        was the set's only live replica (the model is `restarting` meanwhile)."""
        from .replicas import LocalReplica
        model_id, replicas = model.id, model.replicas
        local = replicas.local
        local.alive = False
        local.runner.end_all(EngineError(ErrorCode.WORKER_LOST, f"the model's worker process died "
                                         f"({describe_exit(status)})"))
        await local.runner.engine.aclose(0)
        n_crashes, reason = self.record_crash(model_id, status)

        def use(fresh) -> None:
            replicas.replace_local(LocalReplica(local.node_id, fresh.runner))
            model.restarts += 1
            self.report(Restarted(model_id, model))
        n_crashes, reason = await self._start_again(model, n_crashes, reason, lambda: not replicas.closing, use)
        if n_crashes:
            async with self.locks.of(model_id):
                if self.supervised.get(model_id) is model:
                    replicas.end_all(EngineError(ErrorCode.FAILED, f"'{model_id}' failed"))
                    await replicas.close(0)
                    self._fail(model, self._crash_loop(reason, n_crashes))

    async def _start_again(self, model: LoadedModel, n_crashes: int, reason: str, wanted,
                           use) -> tuple[int, str]:
        """Start the model's engine again after the backoff, and use(fresh LoadedModel) under the
        model's lock, unless it was unloaded or reloaded meanwhile (or `wanted()` says no more).
        -> (0, ...), or the crashes counted when CRASH_LIMIT was reached and the last exit's
        reason (the caller fails the model)."""
        model_id = model.id
        while not self.closing:
            if n_crashes >= CRASH_LIMIT:
                return n_crashes, reason
            await asyncio.sleep(restart_delay(n_crashes))
            async with self.locks.of(model_id):
                if not self._serves(model) or not wanted():
                    return 0, reason                      # unloaded or reloaded meanwhile
                try:
                    fresh = await self.start(model.manifest, model.context_length, kv_type=model.kv_type)
                except Exception as exc:
                    n_crashes, reason = self.record_crash(model_id, None, f"failed to start: {exc}")
                    continue
                use(fresh)
                return 0, reason
        return 0, reason

    @staticmethod
    def _crash_loop(reason: str, n_crashes: int) -> str:
        return f"its worker {reason} {n_crashes} times within {CRASH_WINDOW:g} s"

    # ---- a node went down ------------------------------------------------------------------------

    def node_down(self, node_id: str) -> None:
        """A node went down: every model with layers on it loses its worker now (the RPC
        transport has no timeouts, so a frozen node would hold it forever), then is placed
        again on the nodes left."""
        for model in list(self.supervised.values()):
            if model.replicas is not None:
                model.replicas.node_down(node_id)       # the others serve on; retried before a token
                continue
            if model.spans(node_id) and model.lost is None:
                model.lost = f"node {node_id} went down"
                model.runner.engine.kill(f"'{model.id}' lost part of its placement ({model.lost}); "
                                         "it is being placed again")

    async def _replace(self, model: LoadedModel, status) -> None:
        model_id = model.id
        reason = model.lost or f"its worker {describe_exit(status)}"
        model.runner.end_all(EngineError(ErrorCode.WORKER_LOST, f"'{model_id}' lost part of its placement "
                                         f"({reason}); it is being placed again"))
        await model.runner.engine.aclose(0)
        await self.stop_rpc(model.placement, model.placement_id)
        record = {**exit_record(status), "reason": reason}
        self.report(Exited(model_id, record))
        async with self.locks.of(model_id):
            if not self._serves(model):
                return                                    # unloaded or reloaded meanwhile
            self.report(Unplaced(model_id))               # its memory is no longer placed
            fresh, failure, excluded = await self._place_again(model)
            if self.closing:
                return
            reason = self._naming_lost_nodes(reason, model, excluded)
            self.report(Exited(model_id, {**record, "reason": reason}))
            if fresh is None:
                self._fail(model, f"{reason}, and placing it again failed: {failure}")
                return
            fresh.options, fresh.restarts = model.options, model.restarts + 1
            placed = fresh.placement or self.planner.on_this_cpu(fresh.manifest, fresh.context_length, fresh.kv_type)
            fresh.nodes_lost = model.nodes_lost + max(0, len(model.placement.node_ids) - len(placed.node_ids))
            self.supervised[model_id] = fresh
            self.report(Restarted(model_id, fresh))

    async def _place_again(self, model: LoadedModel):
        """(the model started anew or None, why not, the nodes that did not answer)."""
        failure, excluded = "", set()
        for _ in range(REPLACE_ATTEMPTS):
            try:
                placement = self.planner.plan(model.manifest, model.context_length,
                                              model.options, excluded, kv_type=model.kv_type)
            except DomainError as exc:                    # the nodes left cannot hold it
                return None, exc.message, excluded
            try:
                return (await self.start(model.manifest, model.context_length, placement, model.kv_type),
                        "", excluded)
            except Exception as exc:                      # a node that does not answer (yet)
                failure = str(exc)
                if isinstance(exc, NodeUnreachable):
                    excluded.add(exc.node_id)
            if self.closing:
                break
            await asyncio.sleep(REPLACE_PAUSE)
        return None, failure, excluded

    def _naming_lost_nodes(self, reason: str, model: LoadedModel, excluded: set[str]) -> str:
        """A worker that lost its RPC connection cannot tell which node went: the nodes of its
        placement that are down now, or did not answer when placing it again, are the ones."""
        membership = self.cluster.membership
        if model.lost is not None or membership is None:
            return reason                                 # "node X went down" names it already
        up = {n.id for n in membership.nodes_up()}
        me = self.planner.self_id
        lost = [n for n in model.placement.node_ids if n != me and (n in excluded or n not in up)]
        return f"{reason} (node {', '.join(lost)} is gone)" if lost else reason
