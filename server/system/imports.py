"""Importing less at the daemon's start: its time to a first answer and its memory count on a
device (the engine-worker issue's start-up targets).

- `lazy_import`: a module loaded on its first attribute access, for libraries only some
  daemons use (the HTTP client of the model registry and of the cluster's peers: httpx2
  alone was about a third of the daemon's import time).
- `module_from_package_file`: one plain-Python file of an installed package, without the
  package's __init__ (llama_cpp's and gguf's load numpy, ~10 MB, and more).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def module_from_package_file(package: str, filename: str, name: str) -> ModuleType:
    """`filename` of the installed `package`, loaded on its own under the private `name` (the
    package's own code, never a copy; a process that imported the package reuses its module)."""
    loaded = sys.modules.get(f"{package}.{filename.removesuffix('.py')}") or sys.modules.get(name)
    if loaded is not None:
        return loaded
    found = importlib.util.find_spec(package)                # finds it, runs nothing
    path = os.path.join(found.submodule_search_locations[0], filename)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module                               # dataclasses look it up by name
    spec.loader.exec_module(module)
    return module


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
