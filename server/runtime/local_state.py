"""What this node runs, as the cluster reports it (cluster/node_facts.py's LocalState): its
models from the registry, its share of the power contract."""
from __future__ import annotations

from ..cluster.power import PowerContracts
from ..system import readings
from .registry import ModelRegistry


class RunningNode:
    def __init__(self, registry: ModelRegistry, power: PowerContracts):
        self.registry = registry
        self.power = power

    def loaded_models(self) -> list[str]:
        return list(self.registry.loaded)

    def model_processes(self) -> list[dict]:
        """Each loaded model's engine: where it runs, its memory, and how often it was restarted."""
        out = []
        for model_id, model in self.registry.loaded.items():
            engine = model.runner.engine
            out.append({"id": model_id, "isolation": engine.isolation, "pid": engine.pid,
                        "state": self.registry.state(model_id),
                        "memory_pss_bytes": readings.pss_bytes(engine.pid) if engine.pid else None,
                        "restarts": model.restarts,
                        "last_exit": self.registry.last_exits.get(model_id)})
        return out

    def active_model(self) -> str | None:
        return self.registry.active_chat_model()

    def placements(self) -> list[dict]:
        """The models placed over several nodes: each one's split, nodes and why (a tensor
        split's planner verdict among them)."""
        return [{"model": model_id, **model.placement.describe()}
                for model_id, model in self.registry.loaded.items()
                if model.placement is not None and len(model.placement.shares) > 1]

    def degraded_reasons(self) -> list[str]:
        return self.registry.degraded_reasons()

    def replica_offer(self) -> dict:
        """What this node can run as replicas for its leader (the chat models of its store, by
        digest) and the replicas it runs."""
        return self.registry.replica_host.offer()

    def power_allocation(self, node_id: str) -> dict | None:
        return self.power.allocation(node_id)

    def power_in_force(self) -> dict | None:
        return self.power.in_force()

    def set_compute_scale(self, scale: float) -> None:
        self.registry.set_compute_scale(scale)
