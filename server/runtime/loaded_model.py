"""A model in memory: its manifest, its runner (or set of replicas), where it is placed and what
its life so far was. The registry keeps them (registry.py); the supervisor starts them and keeps
their workers running (supervisor.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cluster.placement import Placement
from ..engine.core import Engine
from ..store.store import Manifest
from .planner import PlacementOptions
from .replicas import ReplicaSet
from .runner import ModelRunner


@dataclass
class LoadedModel:
    manifest: Manifest
    runner: ModelRunner | ReplicaSet   # a set of replicas has the runner's surface
    context_length: int
    created: int
    kv_type: str = "f16"      # its KV cache's type (engine.kv_type, or the load's options.kv_type)
    template: object = None   # chat models: the chat template (inference.sandbox.ChatTemplate)
    max_input: int = 0        # embeddings: tokens one input may have
    restarts: int = 0         # times its worker was restarted after dying
    load_seconds: float = 0.0  # how long its engine took to start (the load's own time)
    last_exit: dict | None = None
    placement: Placement | None = None   # where its layers are (None: this CPU alone)
    placement_id: str | None = None      # its RPC servers' id on every node that runs one
    options: PlacementOptions = field(default_factory=PlacementOptions)   # as asked, for re-placing
    lost: str | None = None              # why its worker is being killed (a node went down)
    nodes_lost: int = 0                  # nodes it was placed on before losing them (degraded)

    @property
    def replicas(self) -> ReplicaSet | None:
        return self.runner if isinstance(self.runner, ReplicaSet) else None

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
