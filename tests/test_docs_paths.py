"""Every file a comment or a document names exists: the path-like names (`runtime/planner.py`,
`native/engine/engine.h`, `docs/cluster.md`) in Markdown, in Python comments and docstrings, in
C++ comments and in the Makefile's and CMake's comments, each checked against the checkout.

A name resolves from the checkout's root, from `server/` (the package `stackd`: `api/...` means
`server/api/...`), from the naming file's folder, or as the tail of a file's path (`engine/core.py`);
a bare file name must be some file's name. Names of other projects' files (llama.cpp's, ggml's,
OpenSSL's) are listed below; a name that is an example (`bench/NAME.py`) is too. Comments that
named files long gone were how this test began: it keeps a move or a rename from leaving them."""
from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Generated or installed trees, not the project's sources.
SKIP_DIRS = {".git", ".venv", ".wheelhouse", "build", "dist", "data", "mutants", "node_modules",
             "__pycache__", ".pytest_cache", ".hypothesis"}
SCANNED = (".md", ".py", ".pyi", ".cpp", ".h")
SCANNED_NAMES = ("Makefile", "CMakeLists.txt")
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:py|pyi|pyx|cpp|h|md|toml|cmake|sh))(?![\w/])")

# Files of other projects that comments name (llama.cpp, ggml, gguf-py, llama-cpp-python,
# OpenSSL, Linux), and names that stand for a kind of file rather than one (`*_scalar.cpp`).
EXTERNAL = {"llama.cpp", "common.cpp", "common.h", "ops.cpp", "ggml-rpc.cpp", "llama-vocab.cpp",
            "constants.py", "server.cpp", "httptools_impl.py", "ggml.h", "ggml-backend-impl.h",
            "ggml-common.h", "ggml-impl.h", "build-info.cpp", "bench/NAME.py", "_scalar.cpp"}
EXTERNAL_PREFIXES = ("common/", "ggml/", "ggml-cpu/", "src/llama", "include/", "tools/", "vllm/",
                     "openssl/", "llama_cpp/", "DATA_DIR/", "DEST_DIR/", "data/", ".../",
                     "arch/",       # the Linux kernel's (arch/arm64/include/uapi/asm/hwcap.h)
                     "homeassistant/")   # Home Assistant's, whose requests the Ollama port's tests record


def sources() -> list[Path]:
    found = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [Path(folder, n) for n in names if n.endswith(SCANNED) or n in SCANNED_NAMES]
    return found


def python_text(source: str):
    """(line, text) of every comment and docstring."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
    except (tokenize.TokenError, IndentationError):
        pass
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
                for offset, line in enumerate(doc.value.value.splitlines()):
                    yield doc.lineno + offset, line


def cpp_text(source: str):
    inside = False
    for number, line in enumerate(source.splitlines(), 1):
        if inside or line.lstrip().startswith("/*"):
            inside = "*/" not in line
            yield number, line
        elif "//" in line:
            yield number, line[line.index("//"):]


def hash_comments(source: str):
    for number, line in enumerate(source.splitlines(), 1):
        if "#" in line:
            yield number, line[line.index("#"):]


def text_of(path: Path):
    source = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".md":
        return enumerate(source.splitlines(), 1)
    if path.suffix in (".py", ".pyi"):
        return python_text(source)
    if path.suffix in (".cpp", ".h"):
        return cpp_text(source)
    return hash_comments(source)


def index(files: list[Path]) -> tuple[set[str], set[str], set[str]]:
    paths = {f.relative_to(ROOT).as_posix() for f in files}
    every = set(paths)
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        every.update(Path(folder, n).relative_to(ROOT).as_posix() for n in names + dirs)
    names = {p.rsplit("/", 1)[-1] for p in every}
    return every, names, paths


def resolves(name: str, naming: str, every: set[str], names: set[str]) -> bool:
    name = name.rstrip(".")
    if name in EXTERNAL or name.startswith(EXTERNAL_PREFIXES):
        return True
    if "/" not in name:
        return name in names
    here = os.path.normpath(os.path.join(os.path.dirname(naming), name))
    candidates = {name, "server/" + name, here}
    if name.startswith("stackd/"):
        candidates.add("server/" + name[len("stackd/"):])
    return bool(candidates & every) or any(p.endswith("/" + name) for p in every)


def stale_names() -> list[str]:
    files = sources()
    every, names, _ = index(files)
    stale = []
    for path in files:
        naming = path.relative_to(ROOT).as_posix()
        # Most files name nothing stale anywhere: only those that do are read comment by comment
        # (tokenizing every Python file would take seconds).
        if all(resolves(m.group(1), naming, every, names)
               for m in PATH.finditer(path.read_text(encoding="utf-8", errors="replace"))):
            continue
        for number, text in text_of(path):
            for match in PATH.finditer(text):
                if not resolves(match.group(1), naming, every, names):
                    stale.append(f"{naming}:{number}: {match.group(1)}")
    return stale


def test_every_file_a_comment_or_a_document_names_exists():
    assert stale_names() == []


def test_the_checker_finds_a_gone_file(tmp_path):
    every = {"server/runtime/planner.py", "server/runtime", "docs/cluster.md"}
    names = {"planner.py", "runtime", "cluster.md"}
    assert resolves("runtime/planner.py", "server/api/x.py", every, names)       # from server/
    assert resolves("docs/cluster.md", "README.md", every, names)
    assert resolves("planner.py", "README.md", every, names)                     # a bare name
    assert not resolves("models/manager.py", "docs/testing.md", every, names)
    assert not resolves("server/engine/native.py", "server/engine/worker.py", every, names)
    assert not resolves("gone.py", "README.md", every, names)
    assert resolves("llama.cpp", "README.md", every, names)                      # another project's
