"""Which models are in memory, and the load / unload transitions.

States: available (in the store only), loading, loaded, unloading, failed. Loads and
unloads of one model are serialized; loading estimates weights + KV cache + buffers
first and refuses, changing nothing, when that does not fit the memory available minus
a reserve. Unloading ends the model's in-flight requests cleanly: each gets a final
"the model was unloaded" error (503 for a waiting response, an error event for a stream),
then the engine is closed and its memory freed.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

from ..system import readings
from ..engine import accel
from ..engine.clients import InlineEngine, WorkerEngine, describe_exit, exit_record
from ..engine.errors import EngineError, ErrorCode
from ..engine.native import Engine, Vocab
from ..engine.runner import ModelRunner
from ..http.errors import ApiError, ErrorKind, invalid
from .gguf_check import GGUFError
from .placement import NodeOffer, Need, Placement, PlacementError, Share, place
from .rpc_devices import NodeUnreachable, PlacementLedger, RpcDevices
from .store import Manifest, ModelStore, valid_model_id

MIB = 1 << 20
MIN_CONTEXT = 32
# Supervision of worker processes: a first crash restarts at once (one lost worker should cost its
# clients no more than a model load); a crash loop backs off 1 s, 2 s, 4 s ... at most 60 s; after
# this many crashes within the window the model is left `failed` (with the last exit) until loaded
# again.
RESTART_BACKOFF_MAX = 60.0
CRASH_LIMIT = 5
CRASH_WINDOW = 300.0
BUFFER_OVERHEAD = 192 * MIB     # compute graph, output logits and scratch, beyond weights and KV
# Placing a model again after a node loss: a node that died may still count as up until its
# heartbeats are missed (3 s), so a failed attempt is retried, without the nodes that refused.
REPLACE_ATTEMPTS = 4
REPLACE_PAUSE = 1.5


def omp_wait_policy(setting: str, embeddings: bool) -> str:
    """engine.omp_wait_policy for one worker. `auto`: a generation worker keeps libgomp's
    default (spin a little, then sleep: what llama-server and an inline engine do; sleeping at
    once cost 3x its tokens/s on a quiet machine, where ggml's barriers after each operation
    are the hot path), an embedding worker sleeps at once (its bulk batches must not spin
    against the chat model's threads on the same cores)."""
    if setting != "auto":
        return setting
    return "passive" if embeddings else "inherit"


def restart_delay(n_crashes: int) -> float:
    """Seconds to wait before restarting a worker that crashed n_crashes times in the window."""
    return 0.0 if n_crashes <= 1 else min(RESTART_BACKOFF_MAX, 2.0 ** (n_crashes - 2))


@dataclass
class EngineSettings:
    n_slots: int = 16
    context_length: int = 2048
    n_batch: int = 512
    n_threads: int = 0
    max_queue: int = 256
    flash_attn: int = -1
    key_share: float = 1.0
    isolation: str = "worker"      # worker: each model's engine in a supervised process; inline
    kernels: str = "auto"          # our Q4_1 matmul (server/engine/accel.py): auto | off
    omp_wait_policy: str = "auto"      # workers' OpenMP barrier waits: auto | passive | active | inherit
    embedding_nice: int = 0        # embedding workers' niceness


@dataclass
class LoadedModel:
    manifest: Manifest
    runner: ModelRunner
    context_length: int
    created: int
    template: object = None   # chat models: the chat template (inference.sandbox.ChatTemplate)
    max_input: int = 0        # embeddings: tokens one input may have
    restarts: int = 0         # times its worker was restarted after dying
    last_exit: dict | None = None
    placement: Placement | None = None   # where its layers are (None: this CPU alone)
    placement_id: str | None = None      # its RPC servers' id on every node that runs one
    options: dict = field(default_factory=dict)   # split_mode and nodes as asked, for re-placing
    lost: str | None = None              # why its worker is being killed (a node went down)
    nodes_lost: int = 0                  # nodes it was placed on before losing them (degraded)

    def spans(self, node_id: str) -> bool:
        return self.placement is not None and node_id in self.placement.node_ids

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def engine(self) -> Engine:
        """The engine, unless an unload has begun: after that its model may be freed at any
        moment on a worker thread, so touching it is refused (503) rather than risked."""
        self.runner.check_open()
        return self.runner.engine


def kv_bytes_per_token(m: Manifest) -> int:
    """K and V, f16, for every layer: 2 * n_layer * n_embd_kv * 2 bytes."""
    if not (m.n_layer and m.n_embd):
        return 0
    n_embd_kv = m.n_embd * (m.n_head_kv or m.n_head or 1) // (m.n_head or 1)
    return 2 * m.n_layer * n_embd_kv * 2


@dataclass
class ModelManager:
    loop: asyncio.AbstractEventLoop
    store: ModelStore
    settings: EngineSettings = field(default_factory=EngineSettings)
    memory_reserve: int = 512 * MIB
    autoload: bool = True
    loaded: dict[str, LoadedModel] = field(default_factory=dict)
    transitions: dict[str, str] = field(default_factory=dict)   # id -> loading / unloading / failed
    errors: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)               # load order: "most recent chat model"
    crashes: dict[str, list[float]] = field(default_factory=dict)  # id -> monotonic crash times
    last_exits: dict[str, dict] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    compute_scale: float = 1.0                                     # the power contract's share
    memory_limit: int = 0                                          # models.memory_limit_mb; 0 = all
    membership: object = None       # the cluster (contract's Membership); None: this node alone
    rpc: object = None              # this node's RPC server children (cluster.rpc_server.RpcServers)
    placements: PlacementLedger = field(default_factory=PlacementLedger)   # what RPC servers it holds
    _closing: bool = False

    # ---- what is there -------------------------------------------------------------------------

    def state(self, model_id: str) -> str:
        if model_id in self.transitions:
            return self.transitions[model_id]
        return "loaded" if model_id in self.loaded else "available"

    def manifest(self, model_id: str) -> Manifest:
        if not valid_model_id(model_id):
            raise invalid("'model' is not a valid model id", "model")
        manifest = self.store.get(model_id)
        if manifest is None:
            raise ApiError(ErrorKind.MODEL_NOT_FOUND, f"the model '{model_id}' is not in the store; "
                           "GET /v1/models lists the models", param="model")
        return manifest

    def describe(self, manifest: Manifest) -> dict:
        model = self.loaded.get(manifest.id)
        out = {"id": manifest.id, "object": "model", "created": manifest.created, "owned_by": "stackd",
               "kind": manifest.kind, "state": self.state(manifest.id),
               "context_length": model.context_length if model else None,
               "trained_context_length": manifest.context_length,
               "architecture": manifest.architecture, "quantization": manifest.quantization,
               "parameter_count": manifest.parameter_count, "size": manifest.size,
               "sha256": manifest.sha256, "file": manifest.file, "source": manifest.source}
        if manifest.id in self.errors:
            out["error"] = self.errors[manifest.id]
        if model is not None:
            out["placement"] = self.placement_of(model).describe()
            out["isolation"] = model.runner.engine.isolation
            out["pid"] = model.runner.engine.pid
            out["restarts"] = model.restarts
        if manifest.id in self.last_exits:
            out["last_exit"] = self.last_exits[manifest.id]
        return out

    def listing(self) -> list[dict]:
        return [self.describe(m) for m in self.store.list()]

    def degraded_models(self) -> list[str]:
        """Models placed again on fewer nodes than they were (the cluster is `degraded`)."""
        return [m.id for m in self.loaded.values() if m.nodes_lost]

    def active_chat_model(self) -> str | None:
        chat = [m for m in self.order if m in self.loaded and self.loaded[m].kind == "chat"]
        return chat[-1] if chat else None

    # ---- use -----------------------------------------------------------------------------------

    async def get(self, model_id: str, kind: str) -> LoadedModel:
        state = self.state(model_id)
        if state == "restarting":
            raise EngineError(ErrorCode.RESTARTING, f"the worker of '{model_id}' died and is being "
                              "restarted; retry shortly")
        if state == "failed" and model_id in self.last_exits:
            why = self.errors.get(model_id) or f"its worker {self.last_exits[model_id]['reason']}"
            raise EngineError(ErrorCode.FAILED, f"'{model_id}' failed: {why}; POST /v1/models/load "
                              "starts it again")
        model = self.loaded.get(model_id)
        if model is None or state == "unloading":
            manifest = self.manifest(model_id)
            if not self.autoload or self.state(model_id) == "unloading":
                raise ApiError(ErrorKind.UNAVAILABLE, f"the model '{model_id}' is not loaded; "
                               "POST /v1/models/load loads it", headers=((b"retry-after", b"1"),))
            self._check_kind(manifest, kind)
            model = await self.load(model_id)
        self._check_kind(model.manifest, kind)
        return model

    @staticmethod
    def _check_kind(manifest: Manifest, kind: str) -> None:
        if manifest.kind != kind:
            raise ApiError(ErrorKind.INVALID_REQUEST, f"the model '{manifest.id}' is a "
                           f"{manifest.kind} model, not a {kind} model", param="model")

    # ---- transitions ---------------------------------------------------------------------------

    def _lock(self, model_id: str) -> asyncio.Lock:
        return self._locks.setdefault(model_id, asyncio.Lock())

    def context_for(self, manifest: Manifest, requested: int | None) -> int:
        trained = manifest.context_length or self.settings.context_length
        if requested is None:
            return max(MIN_CONTEXT, min(self.settings.context_length, trained))
        if requested < MIN_CONTEXT or requested > trained:
            raise invalid(f"'options.context_length' must be from {MIN_CONTEXT} to the model's trained "
                          f"context, {trained}; got {requested}", "options.context_length")
        return requested

    def estimate(self, manifest: Manifest, context_length: int) -> dict[str, int]:
        slots = self.settings.n_slots if manifest.kind == "chat" else 0
        return {"weights": manifest.size,
                "kv_cache": slots * context_length * kv_bytes_per_token(manifest),
                "buffers": BUFFER_OVERHEAD}

    def admit(self, manifest: Manifest, context_length: int) -> None:
        """On this node alone: 507 unless the whole estimate fits what it offers."""
        parts = self.estimate(manifest, context_length)
        needed = sum(parts.values())
        free = self.own_offer()
        if needed > free:
            limit = (f" and a limit of {self.memory_limit // MIB} MiB for models (models.memory_limit_mb)"
                     if self.memory_limit else "")
            raise ApiError(ErrorKind.INSUFFICIENT_MEMORY,
                           f"loading '{manifest.id}' with a context of {context_length} needs about "
                           f"{needed // MIB} MiB (weights {parts['weights'] // MIB}, KV cache "
                           f"{parts['kv_cache'] // MIB}, buffers {parts['buffers'] // MIB}) but only "
                           f"{max(free, 0) // MIB} MiB are free after a reserve of "
                           f"{self.memory_reserve // MIB} MiB{limit}; nothing was changed")

    def own_offer(self) -> int:
        """What this node offers to models now: the available memory minus the reserve, and
        under models.memory_limit_mb less what models placed here take already."""
        free = readings.meminfo()["MemAvailable"] - self.memory_reserve
        if self.memory_limit:
            free = min(free, self.memory_limit - self.placed_here())
        return free

    def placed_here(self) -> int:
        me = self.self_id
        return sum(s.memory_bytes for m in self.loaded.values() for s in self.placement_of(m).shares
                   if s.node_id == me)

    @property
    def self_id(self) -> str:
        return self.membership.self_id if self.membership is not None else "self"

    def placement_of(self, model: LoadedModel) -> Placement:
        if model.placement is not None:
            return model.placement
        parts = self.estimate(model.manifest, model.context_length)
        return Placement("layer", (Share(self.self_id, sum(parts.values()), layers=model.manifest.n_layer or 0),))

    def plan(self, manifest: Manifest, context_length: int, options: dict,
             excluded: set[str] = frozenset()) -> Placement | None:
        """Where the model goes (None: this node's CPU alone); 507 when the cluster cannot
        hold it, 400 for options that cannot be honoured."""
        split_mode, pinned, pipeline = options.get("split_mode"), options.get("nodes"), options.get("pipeline", False)
        others = [] if self.membership is None else [
            n for n in self.membership.nodes_up() if n.id != self.self_id and n.id not in excluded]
        if split_mode in (None, "layer") and pinned is None and options.get("layers") is None:
            try:
                self.admit(manifest, context_length)
                return None
            except ApiError:
                if not others or manifest.kind != "chat":
                    raise
        if manifest.kind != "chat" or not manifest.n_layer:
            raise invalid("only chat models with a known layer count are placed across nodes", "options")
        parts = self.estimate(manifest, context_length)
        need = Need(parts["weights"], parts["kv_cache"], parts["buffers"], manifest.n_layer)
        offers = [NodeOffer(self.self_id, self.own_offer())] + [
            NodeOffer(n.id, n.model_memory_bytes) for n in others]
        try:
            return place(need, offers, self.self_id, split_mode or "layer", pinned, pipeline, options.get("layers"),
                         min(options.get("lanes") or 1, max(1, self.settings.n_slots)))   # a lane needs a slot
        except PlacementError as exc:
            if exc.kind == "invalid":
                raise invalid(str(exc), exc.param)
            raise ApiError(ErrorKind.INSUFFICIENT_MEMORY,
                           f"loading '{manifest.id}' with a context of {context_length}: {exc}; "
                           "nothing was changed") from None

    async def load(self, model_id: str, context_length: int | None = None,
                   options: dict | None = None) -> LoadedModel:
        """`options`: split_mode ("layer" | "tensor"), nodes (ids to pin the placement to),
        pipeline (layer split: the leader through its own loopback RPC server)."""
        options = self._effective(options or {})
        manifest = self.manifest(model_id)
        try:       # a model from an older store was never vocabulary-checked: llama.cpp could abort
            manifest = await self.loop.run_in_executor(None, self.store.ensure_loadable, manifest)
        except GGUFError as exc:
            raise ApiError(ErrorKind.INVALID_REQUEST, f"the model '{model_id}' cannot be loaded: {exc}",
                           param="model") from None
        context = self.context_for(manifest, context_length)
        async with self._lock(model_id):
            current = self.loaded.get(model_id)
            if current is not None:
                same_context = context_length is None or current.context_length == context
                if same_context and (not options or options == current.options):
                    return current                       # same options: nothing to do
                await self._unload_locked(current)       # different options: reload
            placement = self.plan(manifest, context, options)
            self.transitions[model_id] = "loading"
            self.errors.pop(model_id, None)
            self.crashes.pop(model_id, None)
            try:
                model = await self._construct(manifest, context, placement)
                model.options = options
            except (NodeUnreachable, EngineError) as exc:  # a node of the placement does not answer
                self.transitions[model_id] = "failed"
                self.errors[model_id] = str(exc)
                raise ApiError(ErrorKind.UNAVAILABLE, f"loading '{model_id}' failed: {exc}",
                               headers=((b"retry-after", b"1"),)) from None
            except Exception as exc:
                self.transitions[model_id] = "failed"
                self.errors[model_id] = str(exc)
                raise ApiError(ErrorKind.INTERNAL, f"loading '{model_id}' failed: {exc}") from None
            self.transitions.pop(model_id, None)
            self.loaded[model_id] = model
            self.order = [m for m in self.order if m != model_id] + [model_id]
            return model

    def _effective(self, options: dict) -> dict:
        """The placement options that change something: a reload only for those (the defaults
        said out loud, or a pipeline on a one-node cluster, are the same load)."""
        alone = self.membership is None or len(self.membership.nodes_up()) < 2
        return {k: v for k, v in options.items()
                if k in ("split_mode", "nodes", "pipeline", "layers", "lanes") and v is not None
                and (k, v) not in (("split_mode", "layer"), ("pipeline", False), ("lanes", 1))
                and not (k in ("pipeline", "lanes") and alone)}

    async def _construct(self, manifest: Manifest, context: int,
                         placement: Placement | None = None) -> LoadedModel:
        s = self.settings
        path = self.store.model_path(manifest)
        embeddings = manifest.kind == "embedding"
        params = dict(model_path=path, embeddings=embeddings, slots=s.n_slots, context_length=context,
                      batch=s.n_batch, threads=s.n_threads, max_queue=s.max_queue,
                      flash_attn=s.flash_attn, key_share=s.key_share)

        def chat_template(facts):
            if embeddings:
                return None
            from ..inference.templates import template_for
            return template_for(facts)                    # compiling a template takes time too

        def vocabulary():
            vocab = Vocab(path)
            return vocab, chat_template(vocab)

        placement_id = None
        if s.isolation == "inline" and placement is None:
            def construct():
                accel.register(s.kernels)                  # this process runs the engine
                engine = Engine(**params)
                return InlineEngine(engine), chat_template(engine)
            client, template = await self.loop.run_in_executor(None, construct)
        else:                                              # over RPC always a worker: a lost peer aborts
            rpc = None
            if placement is not None:
                placement_id, rpc, split = await self._start_rpc(manifest, placement)
                params.update(split)
            # The daemon's copy of the vocabulary loads while the worker loads the model: on
            # the way to a first answer after boot, the two overlap instead of adding up.
            vocab_job = self.loop.run_in_executor(None, vocabulary)

            async def vocab_loaded() -> Vocab:
                return (await vocab_job)[0]
            vocab = asyncio.ensure_future(vocab_loaded())
            try:
                client = await WorkerEngine.start(self.loop, params, vocab, kernels=s.kernels,
                                                  omp_wait_policy=omp_wait_policy(s.omp_wait_policy,
                                                                                  embeddings),
                                                  nice=s.embedding_nice if embeddings else 0, rpc=rpc)
            except BaseException:
                if placement is not None:
                    await self._stop_rpc(placement, placement_id)
                await asyncio.wait([vocab])                # not left running, its outcome read
                if not vocab.cancelled():
                    vocab.exception()
                raise
            template = (await vocab_job)[1]
            client.on_lost = self._worker_lost
        if self.compute_scale < 1.0:
            client.set_compute_scale(self.compute_scale)
        model = LoadedModel(manifest, ModelRunner(self.loop, client), context, int(time.time()),
                            template=template, placement=placement, placement_id=placement_id)
        if embeddings:
            model.max_input = min(client.n_ctx_train, context) if context else client.n_ctx_train
        return model

    def _devices(self) -> RpcDevices:
        return RpcDevices(self.membership, self.rpc, self.settings.n_threads or (os.cpu_count() or 1),
                          self.placements)

    async def _start_rpc(self, manifest: Manifest, placement: Placement) -> tuple[str, dict, dict]:
        return await self._devices().start(placement, manifest.n_layer)

    async def _stop_rpc(self, placement: Placement, placement_id: str | None) -> None:
        if placement_id is not None:
            await self._devices().stop(placement.node_ids, placement_id)

    def set_compute_scale(self, scale: float) -> None:
        """The power contract's share of full compute, for every engine now and later."""
        self.compute_scale = scale
        for model in self.loaded.values():
            model.runner.engine.set_compute_scale(scale)

    # ---- supervision of worker processes ---------------------------------------------------------

    def _worker_lost(self, client) -> None:
        """A worker died (its socket reached EOF; its requests have their error events)."""
        for model in self.loaded.values():
            if model.runner.engine is client and not self._closing:
                # restarting from now on, not after a hop of the task: its requests have their
                # error events already, and a client that asks at once must not see "loaded"
                self.transitions[model.id] = "restarting"
                if model.placement is not None:
                    self.loop.create_task(self._replace(model, client.exit_status))
                else:
                    self.loop.create_task(self._restart(model, client.exit_status))
                return

    # ---- node loss -----------------------------------------------------------------------------

    def node_down(self, node_id: str) -> None:
        """A node went down: every model with layers on it loses its worker now (the RPC
        transport has no timeouts, so a frozen node would hold it forever), then is placed
        again on the nodes left."""
        for model in list(self.loaded.values()):
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
        await self._stop_rpc(model.placement, model.placement_id)
        self.last_exits[model_id] = {**exit_record(status), "reason": reason}
        self.transitions[model_id] = "restarting"
        async with self._lock(model_id):
            if self.loaded.get(model_id) is not model or self._closing:
                return                                    # unloaded or reloaded meanwhile
            self.loaded.pop(model_id, None)               # its memory is no longer placed
            fresh, failure, excluded = None, "", set()
            for _ in range(REPLACE_ATTEMPTS):
                try:
                    placement = self.plan(model.manifest, model.context_length, model.options, excluded)
                    fresh = await self._construct(model.manifest, model.context_length, placement)
                    break
                except ApiError as exc:                   # the nodes left cannot hold it
                    failure = exc.message
                    break
                except Exception as exc:                  # a node that does not answer (yet)
                    failure = str(exc)
                    if isinstance(exc, NodeUnreachable):
                        excluded.add(exc.node_id)
                if self._closing:
                    return
                await asyncio.sleep(REPLACE_PAUSE)
            reason = self._naming_lost_nodes(reason, model, excluded)
            self.last_exits[model_id]["reason"] = reason
            if fresh is None:
                self.order = [m for m in self.order if m != model_id]
                self.transitions[model_id] = "failed"
                self.errors[model_id] = f"{reason}, and placing it again failed: {failure}"
                return
            fresh.options, fresh.restarts = model.options, model.restarts + 1
            fresh.nodes_lost = model.nodes_lost + max(0, len(model.placement.node_ids) - len(
                (fresh.placement or self.placement_of(fresh)).node_ids))
            self.loaded[model_id] = fresh
            self.transitions.pop(model_id, None)

    def _naming_lost_nodes(self, reason: str, model: LoadedModel, excluded: set[str]) -> str:
        """A worker that lost its RPC connection cannot tell which node went: the nodes of its
        placement that are down now, or did not answer when placing it again, are the ones."""
        if model.lost is not None or self.membership is None:
            return reason                                 # "node X went down" names it already
        up = {n.id for n in self.membership.nodes_up()}
        lost = [n for n in model.placement.node_ids if n != self.self_id and (n in excluded or n not in up)]
        return f"{reason} (node {', '.join(lost)} is gone)" if lost else reason

    def _record_crash(self, model_id: str, status) -> int:
        now = time.monotonic()
        recent = [t for t in self.crashes.get(model_id, []) if now - t < CRASH_WINDOW] + [now]
        self.crashes[model_id] = recent
        self.last_exits[model_id] = exit_record(status)
        return len(recent)

    async def _restart(self, model: LoadedModel, status) -> None:
        model_id = model.id
        model.runner.end_all(EngineError(ErrorCode.WORKER_LOST, f"the model's worker process died "
                                         f"({describe_exit(status)})"))
        await model.runner.engine.aclose(0)               # reaped already: frees the socket
        n_crashes = self._record_crash(model_id, status)
        restarts = model.restarts
        self.transitions[model_id] = "restarting"
        while not self._closing:
            if n_crashes >= CRASH_LIMIT:
                self.loaded.pop(model_id, None)
                self.order = [m for m in self.order if m != model_id]
                self.transitions[model_id] = "failed"
                self.errors[model_id] = (f"its worker {self.last_exits[model_id]['reason']} "
                                         f"{n_crashes} times within {CRASH_WINDOW:g} s")
                return
            await asyncio.sleep(restart_delay(n_crashes))
            async with self._lock(model_id):
                if self.loaded.get(model_id) is not model or self._closing:
                    return                                # unloaded or reloaded meanwhile
                try:
                    fresh = await self._construct(model.manifest, model.context_length)
                except Exception as exc:
                    n_crashes = self._record_crash(model_id, None)
                    self.last_exits[model_id]["reason"] = f"failed to start: {exc}"
                    continue
                fresh.restarts = restarts + 1
                self.loaded[model_id] = fresh
                self.transitions.pop(model_id, None)
                return

    async def unload(self, model_id: str) -> Manifest:
        manifest = self.manifest(model_id)
        async with self._lock(model_id):
            model = self.loaded.get(model_id)
            if model is not None:
                await self._unload_locked(model)
            self.transitions.pop(model_id, None)
            self.errors.pop(model_id, None)
            self.crashes.pop(model_id, None)
        return manifest

    async def _unload_locked(self, model: LoadedModel) -> None:
        self.transitions[model.id] = "unloading"
        try:
            model.runner.end_all(EngineError(ErrorCode.UNLOADED, "the model was unloaded"))
            await model.runner.close()
            if model.placement is not None:
                await self._stop_rpc(model.placement, model.placement_id)
        finally:
            self.loaded.pop(model.id, None)
            self.order = [m for m in self.order if m != model.id]
            self.transitions.pop(model.id, None)

    async def aclose(self, grace: float = 10.0) -> None:
        """Shutting down: every request still open ends, every engine closes (workers exit 0)."""
        self._closing = True
        models = list(self.loaded.values())
        for model in models:
            model.runner.end_all(EngineError(ErrorCode.SHUTTING_DOWN, "the server is shutting down"))
        await asyncio.gather(*(model.runner.close(grace) for model in models))
        for model in models:
            if model.placement is not None:
                await self._stop_rpc(model.placement, model.placement_id)
        if self.rpc is not None:
            self.rpc.stop_all()
        self.loaded.clear()
        self.order.clear()
