"""Which models are in memory, and the load / unload transitions: the model state machine.

States: available (in the store only), loading, loaded, unloading, restarting, failed. Loads
and unloads of one model are serialized, and loads of any two models are admitted one at a time
(so that two never count the same free memory); the planner (planner.py) refuses a load that
does not fit, changing nothing, before anything is allocated, and the registry then makes room
by unloading the least recently used idle models that are not pinned (on_demand.py), until it
fits or nothing more can go (507, naming what holds the memory). An idle model is unloaded
after its keep-alive; the supervisor (supervisor.py) starts the the supervisor (supervisor.py) starts the
engines and keeps them running, and reports what became of a worker as typed events
(lifecycle.py) that `on_worker_event` applies here: the registry alone owns the state. Unloading ends the model's in-flight requests cleanly: each
gets a final "the model was unloaded" error (503 for a waiting response, an error event for a
stream), then the engine is closed and its memory freed.
"""
from __future__ import annotations

import asyncio
import logging
import secrets

from ..cluster.placement import Placement
from ..engine.config import EngineConfig
from ..engine.errors import EngineError, ErrorCode
from ..errors import Code, DomainError, invalid
from ..faults import NONE as NO_FAULTS, Faults
from ..store.gguf_check import GGUFError
from ..store.store import Manifest, ModelStore, valid_model_id
from ..system.durations import NEVER
from .lifecycle import ClusterLinks, Exited, Failed, ModelLocks, Restarted, Restarting, Unplaced, WorkerEvent
from .loaded_model import LoadedModel
from .on_demand import KEEP_ALIVE, MEMORY, OnDemand
from .planner import MIB, Planner, PlacementOptions
from .remote_replica import RemoteReplica
from .replica_host import ReplicaHost
from .tensor_host import TensorHost
from .replicas import LocalReplica, ReplicaSet
from .restart_hold import RestartHold
from .supervisor import Supervisor
from .prompt_cache import PromptCacheConfig
from .worker_process import SpareWorker
from ..cluster.rpc_devices import NodeUnreachable

log = logging.getLogger("stackd.models")

# Retry-After (seconds) of a request that waited models.load_wait for its model's load: a load
# that took that long is near its end, and the retry finds the model loaded or still loading.
LOADING_RETRY_AFTER = 2
# A keep-alive that passed while its model was locked for a transition tries again this much later
# at the earliest (a keep-alive of 0 must not spin while a restart holds the lock).
EXPIRY_RETRY = 1.0


def attention_kernel(kernels: dict, manifest, model) -> str:
    """Whose decode attention a loaded model runs: ours on a chat model's KV cache (f16 or q8_0)
    while our kernels are on (kernels/README.md, "Decode attention"), ggml's otherwise (an
    embedding model, kernels off)."""
    ours = kernels.get("path") is not None and manifest.kind == "chat" and model.kv_type in ("f16", "q8_0")
    return "ours" if ours else "ggml"


class ModelRegistry:
    def __init__(self, loop: asyncio.AbstractEventLoop, store: ModelStore,
                 config: EngineConfig = EngineConfig(), *, memory_reserve: int = 512 * MIB,
                 memory_limit: int = 0, autoload: bool = True, faults: Faults = NO_FAULTS,
                 replicas: int | str = "all", spare: SpareWorker | None = None,
                 cluster: ClusterLinks = ClusterLinks(), keep_alive: float = NEVER,
                 pinned: frozenset[str] = frozenset(), load_wait: float = 60.0,
                 prompt_cache: PromptCacheConfig = PromptCacheConfig()):
        """`cluster`: the cluster's parts this node places over (the daemon builds them first);
        the default is a node alone. `keep_alive`: seconds an idle model stays (models.keep_alive;
        NEVER, the default here, for a registry built by hand); `pinned`: models never unloaded
        but by request (models.pinned); `load_wait`: seconds a request waits for its model's load
        (models.load_wait)."""
        self.loop = loop
        self.store = store
        self.autoload = autoload
        self.loaded: dict[str, LoadedModel] = {}
        self.transitions: dict[str, str] = {}      # id -> loading / unloading / restarting / failed
        self.errors: dict[str, str] = {}
        self.order: list[str] = []                 # load order: "most recent chat model"
        self.last_exits: dict[str, dict] = {}
        self._locks = ModelLocks()                 # shared with the supervisor's restarts
        self.config = config
        self.cluster = cluster
        self.planner = Planner(config, memory_reserve, memory_limit, self.placed_on, replicas,
                               model_path=store.model_path if store is not None else None,
                               membership=cluster.membership)
        self.supervisor = Supervisor(loop, store, config, self.planner, self._locks, self.on_worker_event,
                                     cluster, faults, spare, prompt_cache)
        self.hold = RestartHold(loop, config.restart_hold, config.max_queue, self.state)
        self.replica_host = ReplicaHost(self)     # replicas this node runs for its leader
        self.tensor_host = TensorHost(self, cluster.bind_host)   # tensor shards this node runs for its leader
        self._growing: set[str] = set()           # models whose replicas are being added
        self._claimed: dict[str, str] = {}        # replica id -> node, while it starts there
        self.on_demand = OnDemand(loop, keep_alive, pinned, self._expire, self._now_idle)
        self._became_idle = asyncio.Event()       # a model's last request ended (a load may wait for one)
        self.load_wait = load_wait
        self._admitting = asyncio.Lock()          # one load's plan to its start at a time
        self._autoloads: dict[str, asyncio.Task] = {}   # model id -> the load requests wait for
        self._evicting: set[str] = set()          # models being unloaded to make room

    # ---- what the supervisor reports -------------------------------------------------------------

    def on_worker_event(self, event: WorkerEvent) -> None:
        """A model's worker exited, is being restarted, serves again or gave up (lifecycle.py)."""
        model_id = event.model_id
        if isinstance(event, Restarting):
            if event.alone:
                self.transitions[model_id] = "restarting"
            self.hold.restarting(model_id, event.restart)
        elif isinstance(event, Exited):
            self.last_exits[model_id] = event.record
        elif isinstance(event, Unplaced):
            self.loaded.pop(model_id, None)
        elif isinstance(event, Restarted):
            if self.loaded.get(model_id) is event.model:      # a replica set's local copy replaced
                if self.transitions.get(model_id) == "restarting":
                    self.transitions.pop(model_id)
                self._idle(model_id)
            else:
                self.put_back(model_id, event.model)
        elif isinstance(event, Failed):
            self.fail(model_id, event.why)

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
            raise DomainError(Code.MODEL_NOT_FOUND, f"the model '{model_id}' is not in the store; "
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
        if model is not None and model.replicas is not None:
            out["placement"] = self.replica_placement(model)
            out["replicas"] = model.replicas.describe()
        elif model is not None:
            out["placement"] = self.placement_of(model).describe()
        if model is not None and manifest.kind == "chat":
            out["kv_cache"] = {"type": model.kv_type, "bytes": self.planner.estimate(
                manifest, model.context_length, model.kv_type)["kv_cache"]}
        if model is not None:       # a replica set's: the leader's own copy
            engine = model.runner.engine
            out["isolation"], out["pid"], out["restarts"] = engine.isolation, engine.pid, model.restarts
            out["kernels"] = getattr(engine, "kernels", None)   # path, and weights on ours per type
            if out["kernels"] is not None:
                out["kernels"] = {**out["kernels"], "attention": attention_kernel(out["kernels"], manifest, model)}
        if manifest.id in self.last_exits:
            out["last_exit"] = self.last_exits[manifest.id]
        out["pinned"] = manifest.id in self.on_demand.pinned
        if model is not None:
            keep_alive = self.on_demand.keep_alive_of(manifest.id)
            out["keep_alive"] = keep_alive if keep_alive != NEVER else -1
            out["expires_at"] = self.on_demand.expiry(manifest.id)
            out["in_use"] = self.on_demand.in_use(manifest.id)
        return out

    def listing(self) -> list[dict]:
        return [self.describe(m) for m in self.store.list()]

    def degraded_models(self) -> list[str]:
        """Models placed again on fewer nodes than they were, or missing a replica on a node
        that is still in the cluster (the cluster is `degraded`)."""
        return [m.id for m in self.loaded.values() if m.nodes_lost or self._replicas_lost(m)]

    def degraded_reasons(self) -> list[str]:
        """Why the cluster is `degraded`, for /v1/cluster `reasons`: each split placed on fewer
        nodes, each replica lost with a node that has not come back (a node that left with
        SIGTERM is forgotten, and so is its replica)."""
        reasons = []
        for model in self.loaded.values():
            if model.nodes_lost:
                reasons.append(f"model {model.id} is placed on fewer nodes than it was")
            reasons += [f"model {model.id} lost its replica on node {node} ({why}); it gets one again "
                        "when the node is back" for node, why in self._replicas_lost(model).items()]
        return reasons

    def _replicas_lost(self, model: LoadedModel) -> dict[str, str]:
        replicas = getattr(model, "replicas", None)
        if replicas is None or not replicas.lost_nodes:
            return {}
        membership = self.cluster.membership
        known = {n.id for n in membership.nodes()} if membership is not None else set()
        return {node: why for node, why in replicas.lost_nodes.items() if node in known}

    def active_chat_model(self) -> str | None:
        chat = [m for m in self.order if m in self.loaded and self.loaded[m].kind == "chat"]
        return chat[-1] if chat else None

    def placement_of(self, model: LoadedModel) -> Placement:
        if model.placement is not None:
            return model.placement
        return self.planner.on_this_cpu(model.manifest, model.context_length, model.kv_type)

    def placed_on(self, node_id: str) -> int:
        """Bytes the loaded models hold on a node (models.memory_limit_mb counts them): their
        placements, the replicas this leader runs there, and on this node the replicas it runs
        for its leader."""
        placed = sum(s.memory_bytes for m in self.loaded.values() for s in self.placement_of(m).shares
                     if s.node_id == node_id)
        for model in self.loaded.values():
            replicas = getattr(model, "replicas", None)
            if replicas is not None and node_id != self.planner.self_id and replicas.replica_on(node_id):
                placed += self._replica_bytes(model)
        if node_id == self.planner.self_id:
            placed += self.replica_host.placed_here()
        return placed

    def _replica_bytes(self, model: LoadedModel) -> int:
        return sum(self.planner.estimate(model.manifest, model.context_length, model.kv_type).values())

    def replica_placement(self, model: LoadedModel) -> dict:
        memory = self._replica_bytes(model)
        return {"split_mode": "replica",
                "nodes": [{"id": r.node_id, "memory_bytes": memory} for r in model.replicas.replicas]}

    # ---- use -----------------------------------------------------------------------------------

    async def get(self, model_id: str, kind: str, held_until: float | None = None) -> LoadedModel:
        """The model, loading it if need be (autoload); while its worker restarts, held until it
        is back (restart_hold.py), until `held_until` if given (a request held once already)."""
        state = self.state(model_id)
        if state == "restarting":
            await self.hold.wait(model_id, self.hold.deadline() if held_until is None else held_until)
            state = self.state(model_id)
        if state == "restarting":
            raise EngineError(ErrorCode.RESTARTING, f"the worker of '{model_id}' died and is being "
                              "restarted; retry shortly")
        if state == "failed" and model_id in self.last_exits:
            why = self.errors.get(model_id) or f"its worker {self.last_exits[model_id]['reason']}"
            raise EngineError(ErrorCode.FAILED, f"'{model_id}' failed: {why}; POST /v1/models/load "
                              "starts it again")
        model = self.loaded.get(model_id)
        if model is None or state in ("unloading", "loading"):
            manifest = self.manifest(model_id)
            evicted = model_id in self._evicting        # unloaded to make room: loaded again
            if not self.autoload or (state == "unloading" and not evicted):
                raise DomainError(Code.UNAVAILABLE, f"the model '{model_id}' is not loaded; "
                                  "POST /v1/models/load loads it")
            self._check_kind(manifest, kind)
            self.on_demand.use(model_id)                 # from now: never evicted before it runs
            model = await self._on_demand(model_id)
        self._check_kind(model.manifest, kind)
        self.on_demand.use(model_id)
        return model

    async def _on_demand(self, model_id: str) -> LoadedModel:
        """The model loaded for a request: the load under way (a request's, or one asked for
        with the defaults), or one begun now; waited for at most models.load_wait seconds, then
        503 with Retry-After (the load goes on, and a retry finds it loading or loaded)."""
        task = self._autoloads.get(model_id)
        if task is None:
            task = self._autoloads[model_id] = self.loop.create_task(self.load(model_id))
            task.add_done_callback(lambda done: self._autoload_done(model_id, done))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.load_wait)
        except asyncio.TimeoutError:
            raise DomainError(Code.UNAVAILABLE, f"the model '{model_id}' is being loaded; it did not "
                              f"finish within {self.load_wait:g} s (models.load_wait): retry shortly",
                              retry_after=LOADING_RETRY_AFTER) from None

    def _autoload_done(self, model_id: str, task: asyncio.Task) -> None:
        if self._autoloads.get(model_id) is task:
            del self._autoloads[model_id]
        if not task.cancelled():
            task.exception()                    # the waiters have it; none may be left to ask

    @staticmethod
    def _check_kind(manifest: Manifest, kind: str) -> None:
        if manifest.kind != kind:
            raise DomainError(Code.INVALID, f"the model '{manifest.id}' is a "
                              f"{manifest.kind} model, not a {kind} model", param="model")

    # ---- transitions ---------------------------------------------------------------------------

    def lock(self, model_id: str) -> asyncio.Lock:
        return self._locks.of(model_id)

    async def load(self, model_id: str, context_length: int | None = None,
                   options: dict | None = None, keep_alive: float | None = None,
                   pin: bool = False) -> LoadedModel:
        """`options`: split_mode ("layer" | "tensor"), nodes (ids to pin the placement to),
        pipeline (layer split: the leader through its own loopback RPC server), layers, lanes.
        `keep_alive`: seconds this model stays once idle (NEVER: for ever; None: the setting);
        `pin`: never unloaded but by request from now on (serve --model's files)."""
        if pin:
            self.on_demand.pinned.add(model_id)
        placement_options = PlacementOptions.of(options or {}, self.planner.alone())
        manifest = self.manifest(model_id)
        try:       # a model from an older store was never vocabulary-checked: llama.cpp could abort
            manifest = await self.loop.run_in_executor(None, self.store.ensure_loadable, manifest)
        except GGUFError as exc:
            raise DomainError(Code.INVALID, f"the model '{model_id}' cannot be loaded: {exc}",
                              param="model") from None
        context = self.planner.context_for(manifest, context_length)
        kv_type = self.planner.kv_type_for((options or {}).get("kv_type"))
        async with self.lock(model_id):
            current = self.loaded.get(model_id)
            if current is not None:
                same_context = context_length is None or current.context_length == context
                same_kv = (options or {}).get("kv_type") is None or current.kv_type == kv_type
                if same_context and same_kv and (placement_options.default or placement_options == current.options):
                    if keep_alive is not None:           # same options: only its keep-alive is new
                        self.on_demand.kept(model_id, keep_alive)
                        self._idle(model_id)
                    return current                       # same options: nothing to do
                await self._unload_locked(current)       # different options: reload
            async with self._admitting:
                return await self._admitted(model_id, manifest, context, placement_options, kv_type, keep_alive)

    async def _admitted(self, model_id: str, manifest: Manifest, context: int,
                        placement_options: PlacementOptions, kv_type: str, keep_alive: float | None) -> LoadedModel:
        """The rest of a load, under its model's lock and the admission lock: placed (room made
        if need be), started, put into service."""
        before = self.transitions.get(model_id)      # a failed model's `failed`, kept if refused
        self.transitions[model_id] = "loading"       # while room is made too
        try:
            placement = await self._plan_making_room(manifest, context, placement_options, kv_type)
            replica_nodes = [] if placement is not None else \
                self.planner.replica_nodes(manifest, context, placement_options, kv_type=kv_type)
        except BaseException:
            if self.transitions.get(model_id) == "loading":     # refused: nothing was changed
                if before is None:
                    del self.transitions[model_id]
                else:
                    self.transitions[model_id] = before
            raise
        self.errors.pop(model_id, None)
        self.supervisor.forget_crashes(model_id)
        try:
            started = self.loop.time()
            model = await self.supervisor.start(manifest, context, placement, kv_type)
            model.load_seconds = self.loop.time() - started
            model.options = placement_options
            if placement is None and (replica_nodes or self.planner.replicated(manifest, placement_options)):
                model.runner = ReplicaSet(self.loop, LocalReplica(self.planner.self_id, model.runner),
                                          self.config.key_share, self.config.max_queue)
                await self._add_replicas(model, replica_nodes)
        except (NodeUnreachable, EngineError) as exc:  # a node of the placement does not answer
            self.transitions[model_id] = "failed"
            self.errors[model_id] = str(exc)
            raise DomainError(Code.UNAVAILABLE, f"loading '{model_id}' failed: {exc}") from None
        except Exception as exc:
            self.transitions[model_id] = "failed"
            self.errors[model_id] = str(exc)
            raise DomainError(Code.INTERNAL, f"loading '{model_id}' failed: {exc}") from None
        self.put_back(model_id, model, most_recent=True)
        self.on_demand.loaded(model_id, keep_alive, model.load_seconds)
        self._idle(model_id)
        return model

    # ---- making room -----------------------------------------------------------------------------

    async def _plan_making_room(self, manifest: Manifest, context: int, options: PlacementOptions,
                                kv_type: str):
        """The planner's placement; while it says the model does not fit, the least recently
        used idle model that is not pinned is unloaded and the plan tried again. Models in use
        are waited for (models.load_wait at most, then 503 with Retry-After); where nothing can
        make room (every other model pinned, or the model too large even without the others on
        this node), the planner's 507, with what holds the memory, and nothing was unloaded."""
        tried: set[str] = set()
        until = self.loop.time() + self.load_wait
        while True:
            try:
                return self.planner.plan(manifest, context, options, kv_type=kv_type)
            except DomainError as exc:
                if exc.code is not Code.INSUFFICIENT_MEMORY:
                    raise
                refusal = exc
            movable = [m for m in self.loaded if m != manifest.id and m not in self.on_demand.pinned]
            if not movable or not self._fits_without(manifest, context, kv_type, movable):
                raise DomainError(Code.INSUFFICIENT_MEMORY, f"{refusal.message}; {self._holders(manifest.id)}")
            victim = self._victim(manifest.id, tried)
            if victim is not None:
                tried.add(victim)
                await self._evict(victim, MEMORY, f"to make room for '{manifest.id}'")
                continue
            remaining = until - self.loop.time()       # each one in use: wait for one to be idle
            if remaining <= 0:
                raise DomainError(Code.UNAVAILABLE, f"'{manifest.id}' does not fit until another model is "
                                  f"unloaded, and none became idle within {self.load_wait:g} s (models.load_wait); "
                                  f"{self._holders(manifest.id, waited=True)}", retry_after=LOADING_RETRY_AFTER)
            self._became_idle.clear()
            try:
                await asyncio.wait_for(self._became_idle.wait(), remaining)
            except asyncio.TimeoutError:
                pass
            tried.clear()                              # one that was taken may be idle now

    def _fits_without(self, manifest: Manifest, context: int, kv_type: str, movable: list[str]) -> bool:
        """Whether unloading every model of `movable` could make room: on a node alone, its
        memory on this node added to what is free must cover the estimate (in a cluster, the
        planner's split may use other nodes too, so it is tried)."""
        if not self.planner.alone():
            return True
        here = self.planner.self_id
        freed = sum(s.memory_bytes for m in movable for s in self.placement_of(self.loaded[m]).shares
                    if s.node_id == here)
        return sum(self.planner.estimate(manifest, context, kv_type).values()) <= self.planner.own_offer() + freed

    def _victim(self, wanted: str, tried: set[str]) -> str | None:
        """The least recently used loaded model that may go now: not the one wanted, not
        pinned, not in use, in no transition, its lock free (a lock held means a transition
        under way, and waiting for it here could wait for this very load)."""
        for model_id in self.on_demand.least_recent_first(self.loaded):
            if (model_id != wanted and model_id not in tried and self.on_demand.why_kept(model_id) is None
                    and model_id not in self.transitions and not self.lock(model_id).locked()):
                return model_id
        return None

    def _holders(self, wanted: str, waited: bool = False) -> str:
        """What holds the memory a refused load would need, and why each stays."""
        held = []
        for model_id, model in self.loaded.items():
            if model_id == wanted:
                continue
            why = self.on_demand.why_kept(model_id) or (
                self.transitions.get(model_id) or ("busy" if self.lock(model_id).locked() else "idle"))
            nodes = {s.node_id: s.memory_bytes for s in self.placement_of(model).shares}
            where = ", ".join(f"{b // MIB} MiB on {n}" if len(nodes) > 1 or n != "self" else f"{b // MIB} MiB"
                              for n, b in nodes.items())
            held.append(f"'{model_id}' {where} ({why})")
        if not held:
            return "no other model is loaded, so nothing can make room"
        if waited:
            return "memory is held by " + "; ".join(held)
        return "nothing more can be unloaded to make room: memory is held by " + "; ".join(held)

    async def _evict(self, model_id: str, reason: str, why: str) -> bool:
        """Unload an idle model that was not asked to go (to make room, or its keep-alive
        passed); False when it may not go any more (a request took it meanwhile). Requests that
        ask for it while it goes wait, and load it again."""
        lock = self.lock(model_id)
        if lock.locked():
            return False
        async with lock:
            model = self.loaded.get(model_id)
            if model is None or model_id in self.transitions or self.on_demand.why_kept(model_id) is not None:
                return False
            log.info("models: unloading %s (%s): %s", model_id, reason.replace("_", "-"), why)
            self._evicting.add(model_id)
            try:
                await self._unload_locked(model)
            finally:
                self._evicting.discard(model_id)
            self.on_demand.unloaded(model_id, reason)
            self.supervisor.forget_crashes(model_id)
            return True

    def _idle(self, model_id: str) -> None:
        if model_id in self.loaded:
            self.on_demand.idle(model_id)

    def _now_idle(self, model_id: str) -> None:
        """Nobody uses the model any more: its keep-alive starts, and a load waiting for room
        looks again."""
        self._idle(model_id)
        self._became_idle.set()

    def _expire(self, model_id: str) -> None:
        """Its keep-alive passed: unloaded unless it was taken, or is in a transition, meanwhile
        (then its clock starts again, from the next idle moment)."""
        if model_id not in self.loaded or self.supervisor.closing:
            return
        evicting = self.loop.create_task(self._evict(model_id, KEEP_ALIVE, "idle for its keep-alive "
                                                     f"({self.on_demand.keep_alive_of(model_id):g} s)"))

        def after(done: asyncio.Task) -> None:     # kept: its clock again, a second on at least
            if not done.cancelled() and done.exception() is None and not done.result():
                self.loop.call_later(EXPIRY_RETRY, self._idle, model_id)
        evicting.add_done_callback(after)

    # ---- replicas --------------------------------------------------------------------------------

    async def _add_replicas(self, model: LoadedModel, node_ids: list[str]) -> None:
        """Start a replica of `model` on each node (at once, in parallel); one that fails to
        start is left out (the log says why; the model's replicas list the others)."""
        if not node_ids:
            return
        fresh = [RemoteReplica(self.loop, self.cluster.membership, node_id, secrets.token_hex(8),
                               on_lost=model.replicas.replica_lost) for node_id in node_ids]
        for replica in fresh:       # claimed from before its start: heartbeats list it (fencing)
            self._claimed[replica.replica_id] = replica.node_id
        try:
            results = await asyncio.gather(*(r.start(model.manifest, model.context_length, model.kv_type) for r in fresh),
                                           return_exceptions=True)
        finally:
            for replica in fresh:
                self._claimed.pop(replica.replica_id, None)
        for replica, result in zip(fresh, results):
            if isinstance(result, BaseException):
                log.warning("models: no replica of %s on node %s: %s", model.id, replica.node_id, result)
                continue
            if model.replicas.closing or self.loaded.get(model.id, model) is not model:
                self.loop.create_task(replica.stop())      # unloaded meanwhile
                continue
            model.replicas.add(replica)
            model.replicas.lost_nodes.pop(replica.node_id, None)    # the node got its replica back

    def replica_ids_on(self, node_id: str) -> list[str]:
        """The replicas this leader holds on a node, starting ones included: its heartbeat
        answers list them, and the follower stops any other (replica_host.keep_only)."""
        held = [r.replica_id for m in self.loaded.values() if m.replicas is not None
                for r in m.replicas.replicas if r.remote and r.node_id == node_id]
        return held + [rid for rid, node in self._claimed.items() if node == node_id]

    def grow_replicas(self) -> None:
        """A follower joined or came back: each model with replicas that wants more gets one
        there, at the model's next idle moment (now, if no request is open)."""
        for model in list(self.loaded.values()):
            replicas = model.replicas
            if replicas is None or replicas.closing or model.id in self._growing:
                continue
            have = {r.node_id for r in replicas.replicas}
            try:
                nodes = self.planner.replica_nodes(model.manifest, model.context_length, model.options, have,
                                                   kv_type=model.kv_type)
            except DomainError:
                continue
            if not nodes:
                continue
            if not replicas.idle:
                replicas.when_idle(self.grow_replicas)
                continue
            self._growing.add(model.id)
            self.loop.create_task(self._grow(model, nodes))

    async def _grow(self, model: LoadedModel, nodes: list[str]) -> None:
        try:
            await self._add_replicas(model, nodes)
        finally:
            self._growing.discard(model.id)

    def put_back(self, model_id: str, model: LoadedModel, most_recent: bool = False) -> None:
        """`model` serves `model_id` from now on (loaded, restarted or placed again); a load
        also makes it the most recent (the active chat model)."""
        self.transitions.pop(model_id, None)
        self.loaded[model_id] = model
        self.supervisor.supervise(model)
        self._hold_over_restarts(model)
        if not most_recent:                      # restarted or placed again: its clock runs on
            self._idle(model_id)
        if most_recent:
            self.order = [m for m in self.order if m != model_id] + [model_id]

    def _hold_over_restarts(self, model: LoadedModel) -> None:
        """Requests its worker's death catches before their first event are submitted again on
        the restarted worker (runner.Held) or, for a set of replicas, on another replica or the
        restarted local one (ReplicaSet.retry)."""
        if model.kind != "chat":
            return
        model_id = model.id

        async def restarted():
            if self.state(model_id) not in ("restarting", "loaded"):     # unloaded, failed: no retry
                raise EngineError(ErrorCode.UNLOADED, f"'{model_id}' is no longer loaded")
            return (await self.get(model_id, "chat")).runner
        model.runner.restarted = restarted

    def fail(self, model_id: str, why: str) -> None:
        """The model is left `failed`, with why, until it is loaded again."""
        self.loaded.pop(model_id, None)
        self.order = [m for m in self.order if m != model_id]
        self.transitions[model_id] = "failed"
        self.errors[model_id] = why
        self.on_demand.unloaded(model_id)

    def set_compute_scale(self, scale: float) -> None:
        """The power contract's share of full compute, for every engine now and later."""
        self.supervisor.set_compute_scale(scale, self.loaded.values())

    def set_keep_alive(self, model_id: str, seconds: float) -> None:
        """A request's own keep-alive for its model (Ollama's keep_alive), counted from the moment
        the model is idle, as a load's is; 0 unloads it as soon as nobody uses it, so a request
        never cuts another's short (an inference key may ask for it: unload itself is model
        management)."""
        if model_id not in self.loaded:
            return                               # a load sets its own (or the setting's)
        self.on_demand.kept(model_id, seconds)   # the clock stopped, to start with the new value
        if self.on_demand.in_use(model_id) == 0:
            self._idle(model_id)                 # idle now: from now (0: at once)

    async def unload_when_idle(self, model_id: str) -> None:
        """keep_alive 0 with nothing to generate (Ollama's way to unload): unloaded now when
        nobody uses it, else as soon as its requests end; never one of them cut short."""
        self.manifest(model_id)
        if model_id not in self.loaded:
            return
        self.on_demand.kept(model_id, 0)
        if self.on_demand.in_use(model_id) == 0:
            await self._evict(model_id, KEEP_ALIVE, "its keep_alive is 0")

    async def load_with_context(self, model_id: str, context_length: int) -> LoadedModel:
        """The model with at least `context_length` tokens of context per sequence (Ollama's
        num_ctx): as loaded when it has as much; loaded again with it once nobody uses it
        (Ollama's scheduler also lets a runner's requests end before it reloads), waiting up
        to models.load_wait, then 503 with Retry-After; loaded with it when not loaded."""
        until = self.loop.time() + self.load_wait
        while True:
            current = self.loaded.get(model_id)
            if current is not None and current.context_length >= context_length:
                return current
            if current is None or (self.on_demand.in_use(model_id) == 0 and model_id not in self.transitions):
                return await self.load(model_id, context_length)
            remaining = until - self.loop.time()
            if remaining <= 0:
                raise DomainError(Code.UNAVAILABLE, f"'{model_id}' is in use with {current.context_length} tokens "
                                  f"of context; {context_length} needs it loaded again once its requests end, "
                                  f"and they did not within {self.load_wait:g} s (models.load_wait)",
                                  retry_after=LOADING_RETRY_AFTER)
            self._became_idle.clear()
            try:
                await asyncio.wait_for(self._became_idle.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def unload(self, model_id: str) -> Manifest:
        manifest = self.manifest(model_id)
        async with self.lock(model_id):
            model = self.loaded.get(model_id)
            if model is not None:
                await self._unload_locked(model)
                self.on_demand.unloaded(model_id)
            self.transitions.pop(model_id, None)
            self.errors.pop(model_id, None)
            self.supervisor.forget_crashes(model_id)
        return manifest

    async def _unload_locked(self, model: LoadedModel) -> None:
        self.transitions[model.id] = "unloading"
        try:
            model.runner.end_all(EngineError(ErrorCode.UNLOADED, "the model was unloaded"))
            await self.supervisor.stop(model)
        finally:
            self.loaded.pop(model.id, None)
            self.order = [m for m in self.order if m != model.id]
            self.transitions.pop(model.id, None)

    async def aclose(self, grace: float = 10.0) -> None:
        """Shutting down: every request still open ends, every engine closes (workers exit 0)."""
        self.supervisor.shutting_down()
        models = list(self.loaded.values())
        for model in models:
            self.on_demand.unloaded(model.id)          # no keep-alive fires into the shutdown
            model.runner.end_all(EngineError(ErrorCode.SHUTTING_DOWN, "the server is shutting down"))
        await asyncio.gather(*(model.runner.close(grace) for model in models))
        for model in models:
            await self.supervisor.stop_rpc(model.placement, model.placement_id)
        if self.cluster.rpc is not None:
            self.cluster.rpc.stop_all()
        self.loaded.clear()
        self.order.clear()
