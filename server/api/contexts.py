"""What each route group's handlers get: their group's services, typed, built once by the daemon
(the composition root). A handler is `handler(ctx, request)` with the context of its table."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:                  # annotations only: the registry brings the engine's library
    from ..cluster.membership import Membership
    from ..cluster.node_facts import NodeFacts
    from ..cluster.power import PowerContracts
    from ..cluster.rpc_server import RpcServers
    from ..observe.metrics import Metrics
    from ..runtime.registry import ModelRegistry
    from ..store.local import LocalImports
    from ..store.pulling import PullService


@dataclass(frozen=True)
class InferenceContext:
    """/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models."""
    models: ModelRegistry


@dataclass(frozen=True)
class ModelsContext:
    """/v1/models/load, unload, pull, import."""
    models: ModelRegistry
    pulls: PullService
    imports: LocalImports


@dataclass(frozen=True)
class OllamaContext:
    """Ollama's port: its generation and listings over the registry, its pulls, imports and
    copies over the store; OpenAI's routes on that port take it too (they read `models`)."""
    models: ModelRegistry
    pulls: PullService
    imports: LocalImports


@dataclass
class ClusterContext:
    """/v1/health, topology, cluster, nodes, power, /metrics, the trace; /internal/v1/..."""
    facts: NodeFacts
    membership: Membership
    power: PowerContracts
    models: ModelRegistry
    metrics: Metrics
    rpc: RpcServers
    trace_reply_timeout: float
    health_cache: tuple | None = None     # (state, encoded answer): probes reuse one body
