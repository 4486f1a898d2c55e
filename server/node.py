"""Everything a handler of the node API may need, built once at start-up."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .auth.keys import KeyStore
from .auth.ratelimit import RateLimiter
from .cluster.identity import Identity
from .cluster.readings import Thermometer
from .config import Settings
from .metrics import Metrics


@dataclass
class Node:
    settings: Settings
    identity: Identity
    keys: KeyStore
    limiter: RateLimiter
    metrics: Metrics
    thermometer: Thermometer = field(default_factory=Thermometer)
    started: float = field(default_factory=time.monotonic)
    active_model: str | None = None
    loaded_models: list[str] = field(default_factory=list)
    health_cache: tuple | None = None

    def uptime_seconds(self) -> int:
        return int(time.monotonic() - self.started)

    def reload_keys(self) -> None:
        if self.keys.reload_if_changed():
            self.limiter.forget_except({record.id for record in self.keys.records()})
