"""A module loaded on its first attribute access, not at import.

For libraries only some daemons use (the HTTP client of the model registry and of the
cluster's peers): a single-node daemon that never pulls answers its first request without
paying their import (httpx2 alone was about a third of the daemon's import time).
"""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_import(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
