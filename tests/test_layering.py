"""The package's import rules, as docs/architecture.md draws them, hold for every module.

The rules are read from the document itself (its `layers` and `only` blocks), so the drawing
and the check cannot drift apart: a module may import its own folder and the folders of lower
layers; the top layer (entry points) may import anything; a folder named in `only` may import
no more than the folders listed for it.
"""
from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "server"
DOC = ROOT / "docs" / "architecture.md"
ROOT_MODULE = ""        # the package itself (__init__: its version and name)


def fenced(name: str) -> list[list[str]]:
    block = re.search(rf"```{name}\n(.*?)```", DOC.read_text(), re.S)
    assert block, f"docs/architecture.md has no ```{name} block"
    return [line.replace(":", " ").split() for line in block.group(1).splitlines() if line.strip()]


def rules() -> tuple[dict[str, int], dict[str, set[str]]]:
    tier = {name: level for level, names in enumerate(fenced("layers")) for name in names}
    only = {names[0]: set(names[1:]) for names in fenced("only")}
    return tier, only


def owner(path: pathlib.Path) -> str:
    """The top-level folder (or module) of the package a file belongs to."""
    parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
    return ROOT_MODULE if parts == ("__init__",) else parts[0]


def imported(path: pathlib.Path, source: str | None = None) -> set[str]:
    """The package's top-level folders this file imports (relative imports: the package's own)."""
    package = list(path.relative_to(PACKAGE_DIR).parent.parts)
    out = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package[:len(package) - (node.level - 1)]
        target = base + (node.module.split(".") if node.module else [])
        if target:
            out.add(target[0])
        else:                               # `from .. import x`: x is a folder, or the root's name
            out.update(alias.name if (PACKAGE_DIR / alias.name).exists() or
                       (PACKAGE_DIR / f"{alias.name}.py").exists() else ROOT_MODULE
                       for alias in node.names)
    return out


def modules() -> list[pathlib.Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def test_every_folder_of_the_package_has_a_layer():
    tier, _ = rules()
    folders = {owner(path) for path in modules()} - {ROOT_MODULE}
    assert folders <= set(tier), f"not drawn in docs/architecture.md: {sorted(folders - set(tier))}"


def test_no_import_breaks_the_drawn_rules():
    tier, only = rules()
    tier.setdefault(ROOT_MODULE, 0)
    top = max(tier.values())
    broken = []
    for path in modules():
        me = owner(path)
        if me == ROOT_MODULE:               # __init__: installs the Python twins' finder (compiled)
            continue
        for other in imported(path) - {me}:
            if other == "_engine":          # the native module, re-exported by engine/core.py
                other = "engine"
            if other == me:
                continue
            if me in only and other not in only[me] | {ROOT_MODULE}:
                broken.append(f"{path.relative_to(ROOT)}: {me} may not import {other} (only)")
            elif tier[me] != top and tier.get(other, top) >= tier[me]:
                broken.append(f"{path.relative_to(ROOT)}: {me} (layer {tier[me]}) imports "
                              f"{other} (layer {tier.get(other)})")
    assert not broken, "\n".join(broken)


def test_the_check_sees_a_broken_rule():
    """A lower layer importing a higher one is seen (the check can fail)."""
    probe = PACKAGE_DIR / "http" / "probe.py"          # never written: its source is given
    tier, _ = rules()
    assert imported(probe, "from ..runtime import registry\n") == {"runtime"}
    assert imported(probe, "from .. import errors, __version__\n") == {"errors", ROOT_MODULE}
    assert tier["runtime"] > tier["http"]


# ---- the test support (testing/, at the checkout's root) stays out of the product ------------

def imports_test_support(source: str) -> list[str]:
    """The absolute imports of the top-level `testing` package (or of the old `stackd.testing`)
    in `source`: `import testing.x`, `from testing import x`, `from stackd.testing...`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [name for name in names
                  if name.split(".")[0] == "testing" or name.startswith("stackd.testing")]
    return found


def test_no_module_of_the_package_imports_the_test_support():
    broken = [f"{path.relative_to(ROOT)}: {name}" for path in modules()
              for name in imports_test_support(path.read_text())]
    assert not broken, "\n".join(broken)
    assert not (PACKAGE_DIR / "testing").exists(), "the test support lives in testing/, outside server/"


def test_the_check_sees_an_import_of_the_test_support():
    assert imports_test_support("from testing import loopback_peers\n") == ["testing"]
    assert imports_test_support("import testing.netns as n\n") == ["testing.netns"]
    assert imports_test_support("from stackd.testing.daemon import Daemon\n") == ["stackd.testing.daemon"]
    assert imports_test_support("from .faults import Faults\nimport unittest\n") == []


def test_the_package_list_leaves_the_test_support_out():
    """setup.py's packages: `stackd` and its subpackages under server/, none of testing/ (the
    wheel ships what this list names; `pip wheel --no-deps .` lists the same)."""
    source = (ROOT / "setup.py").read_text()
    assert 'PACKAGE, SOURCE_DIR = "stackd", "server"' in source
    assert "find_packages(SOURCE_DIR)" in source                 # only server/'s folders
    from setuptools import find_packages
    packages = ["stackd"] + [f"stackd.{name}" for name in find_packages(str(PACKAGE_DIR))]
    assert not [name for name in packages if name.split(".")[0] == "testing" or ".testing" in name]
    assert (ROOT / "testing" / "__init__.py").exists()


# ---- the registry owns model state; what it builds never reaches back into it ----------------

# The registry (runtime/registry.py) builds these and hands them their dependencies through
# their constructors; none imports it (at the top or inside a function), so none can hold it.
BUILT_BY_THE_REGISTRY = ("supervisor", "lifecycle", "loaded_model", "planner")


def runtime_imports(source: str) -> set[str]:
    """The runtime/ modules a runtime/ module's source imports, wherever the import stands."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("stackd.runtime."):
            out.add(node.module.split(".")[2])
    return out


def test_what_the_registry_builds_never_imports_it():
    broken = [name for name in BUILT_BY_THE_REGISTRY
              if "registry" in runtime_imports((PACKAGE_DIR / "runtime" / f"{name}.py").read_text())]
    assert not broken, f"these runtime modules import the registry: {broken}"


def test_the_check_sees_an_import_of_the_registry():
    assert runtime_imports("def f():\n    from .registry import LoadedModel\n") == {"registry"}
    assert runtime_imports("from . import registry\n") == {"registry"}
    assert runtime_imports("from .lifecycle import Exited\n") == {"lifecycle"}
