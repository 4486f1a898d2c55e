"""Everything a handler of the node API may need, built once at start-up."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .auth.keys import KeyStore
from .auth.ratelimit import RateLimiter
from .cluster.identity import Identity
from .system.readings import Thermometer
from .config import Settings
from .observe.metrics import Metrics


@dataclass
class Node:
    settings: Settings
    identity: Identity
    keys: KeyStore
    limiter: RateLimiter
    metrics: Metrics
    thermometer: Thermometer = field(default_factory=Thermometer)
    started: float = field(default_factory=time.monotonic)
    models: object = None                 # runtime.registry.ModelRegistry, once the loop runs
    pulls: object = None                  # models.pulling.PullService
    power: object = None                  # cluster.power.PowerContracts
    membership: object = None             # cluster.membership.Membership
    health_cache: tuple | None = None

    @property
    def active_model(self) -> str | None:
        return self.models.active_chat_model() if self.models is not None else None

    @property
    def loaded_models(self) -> list[str]:
        return list(self.models.loaded) if self.models is not None else []

    def uptime_seconds(self) -> int:
        return int(time.monotonic() - self.started)

    def reload_keys(self) -> None:
        if self.keys.reload_if_changed():
            self.limiter.forget_except({record.id for record in self.keys.records()})
