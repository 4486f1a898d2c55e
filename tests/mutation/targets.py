"""The one list of mutation targets: which files `make mutate` mutates and which of their mutants
count. The Makefile asks this file for mutmut's names (`python tests/mutation/targets.py`),
score.py counts with it, and test_targets.py checks pyproject's [tool.mutmut] only_mutate (TOML
cannot ask) against it."""
from __future__ import annotations

import sys

# file -> the mutants that count (fnmatch patterns over mutmut's names, after the module)
TARGETS = {
    "server/auth/guard.py": ("*",),
    "server/auth/keys.py": ("*",),
    "server/auth/permissions.py": ("*",),
    "server/auth/ratelimit.py": ("*",),
    "server/http/validate.py": ("*",),
    "server/api/inference/params.py": ("*",),
    "server/chat/grammar.py": ("*",),
    "server/store/store.py": ("*",),
    # the planner's admission functions (the rest of it is placement over the cluster)
    "server/runtime/planner.py": ("x_kv_bytes_per_token__mutmut_*", "*context_for__mutmut_*",
                                  "*estimate__mutmut_*", "*admit__mutmut_*"),
}


def module_of(path: str) -> str:
    return path[:-len(".py")].replace("/", ".")


def mutant_names() -> list[str]:
    """What `mutmut run` is given: module.pattern for every target."""
    return [f"{module_of(path)}.{pattern}" for path, patterns in TARGETS.items() for pattern in patterns]


if __name__ == "__main__":
    print(" ".join(f"'{name}'" for name in mutant_names()))
    sys.exit(0)
