"""Which modules are compiled, and the switch that runs their Python twins instead.

The modules below are written in Cython's pure-Python mode: setup.py compiles them,
and the same `.py` source is their Python twin. Production requires the compiled
ones (`require_compiled`), so a missing build fails loudly instead of silently
running slower. STACKD_PURE_PYTHON=1 loads the twins on purpose: the protocol
tests run once each way, and it helps when profiling with Python tools.

This file must import nothing from the package: setup.py reads it before a build.
"""
from __future__ import annotations

import importlib.util
import os
import sys

COMPILED_MODULES = (
    "http.protocol",
    "http.wire",
    "http.request",
    "http.response",
    "http.routing",
    "http.validate",
    "http.server",
    "auth.guard",
    "auth.ratelimit",
    "observe.metrics",
)
# How Cython compiles them (setup.py; packaging/wheels.py's cross build, which compiles the
# same C for another architecture)
CYTHON_DIRECTIVES = {"language_level": "3", "boundscheck": False, "wraparound": False, "binding": False}
PURE_ENV = "STACKD_PURE_PYTHON"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The package's name in this process: `stackd` once installed, `server` when a checkout runs
# `python -m server` (setup.py reads this file as a script, and compiles `stackd.*`).
PACKAGE = __name__.rpartition(".")[0] or "stackd"


def qualified(module: str) -> str:
    """`http.protocol` -> `stackd.http.protocol` (or `server.http.protocol` in a checkout)."""
    return f"{PACKAGE}.{module}"


def source_path(module: str) -> str:
    return os.path.join(_PACKAGE_DIR, *module.split(".")) + ".py"


class _PureFinder:
    """Resolve the compiled modules to their `.py` sources (a meta path finder: find_spec is
    all one needs; importlib.abc's base class would cost every process ~30 ms of imports)."""

    def find_spec(self, fullname, path, target=None):
        root, _, module = fullname.partition(".")
        if root == PACKAGE and module in COMPILED_MODULES:
            return importlib.util.spec_from_file_location(fullname, source_path(module))
        return None


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV) == "1"


def install_pure_finder() -> None:
    if not any(isinstance(f, _PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PureFinder())


def not_compiled() -> list[str]:
    missing = []
    for name in COMPILED_MODULES:
        module = importlib.import_module(qualified(name))
        if not (module.__file__ or "").endswith(".so"):
            missing.append(name)
    return missing


def require_compiled() -> None:
    if pure_requested():
        return
    missing = not_compiled()
    if missing:
        raise SystemExit(f"stackd: native modules are not built ({', '.join(missing)}); "
                         f"run `make setup` (or set {PURE_ENV}=1 to run the Python twins)")
