"""What an API key may do. `admin` implies every other permission."""
from __future__ import annotations

INFERENCE = "inference"
CLUSTER_READ = "cluster:read"
CLUSTER_WRITE = "cluster:write"
MODELS_MANAGE = "models:manage"
ADMIN = "admin"

ALL = (INFERENCE, CLUSTER_READ, CLUSTER_WRITE, MODELS_MANAGE, ADMIN)


def parse(text: str) -> frozenset[str]:
    """'inference,cluster:read' -> frozenset; raises ValueError naming an unknown permission."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError("at least one permission is required")
    unknown = [name for name in names if name not in ALL]
    if unknown:
        raise ValueError(f"unknown permission {unknown[0]!r}; choose from {', '.join(ALL)}")
    return frozenset(names)


def effective(granted: frozenset[str]) -> frozenset[str]:
    return frozenset(ALL) if ADMIN in granted else granted

# A route anyone may call without credentials (the console's health, login, JWKS). Compared
# by identity: a route table uses this very object.
PUBLIC = "public"
