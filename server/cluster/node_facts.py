"""This node as the cluster reports it, built once at start-up: who it is, its settings, its
temperature sensor, since when it runs, and its measured compute (compute_speed.py).

What the node runs (its models, its share of a power contract) changes while it runs and comes
from above the cluster layer: `LocalState` is what the membership and the views ask of it. The
daemon hands the membership the real one once the models and the power contracts exist; until
then it reports a node with nothing loaded and no contract.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from ..config import Settings
from ..system.readings import Thermometer
from .compute_speed import ComputeSpeed
from .identity import Identity


@dataclass(frozen=True)
class NodeFacts:
    identity: Identity
    settings: Settings
    thermometer: Thermometer = field(default_factory=Thermometer)
    started: float = field(default_factory=time.monotonic)
    compute: ComputeSpeed = field(default_factory=lambda: ComputeSpeed(1))   # unmeasured until started

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    def uptime_seconds(self) -> int:
        return int(time.monotonic() - self.started)


class LocalState(Protocol):
    def loaded_models(self) -> list[str]: ...
    def model_processes(self) -> list[dict]: ...
    def active_model(self) -> str | None: ...
    def degraded_reasons(self) -> list[str]: ...
    def replica_offer(self) -> dict | None: ...
    def power_allocation(self, node_id: str) -> dict | None: ...
    def power_in_force(self) -> dict | None: ...
    def set_compute_scale(self, scale: float) -> None: ...


class NothingYet:
    """A node with no model loaded and no power contract (before the daemon has built them)."""

    def loaded_models(self) -> list[str]:
        return []

    def model_processes(self) -> list[dict]:
        return []

    def active_model(self) -> str | None:
        return None

    def degraded_reasons(self) -> list[str]:
        return []

    def replica_offer(self) -> dict | None:
        return None

    def power_allocation(self, node_id: str) -> dict | None:
        return None

    def power_in_force(self) -> dict | None:
        return None

    def set_compute_scale(self, scale: float) -> None:
        pass
