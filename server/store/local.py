"""Local GGUF files into the store: `stackd models add`, POST /v1/models/import, `serve --model`
and file paths in `models.preload`.

A request may name a file under the import directory only (`models.import_dir`, by default
DATA_DIR/import): the path it sends is resolved (symlinks, "..") and must lie under the resolved
import directory, and the file the store then opens is checked again, by the path of the opened
descriptor, so a symlink swapped in between cannot lead it out. The command line and the settings
name any file the operator can read: they run with the operator's own rights.

Every file passes what a pulled model passes (store.import_file: GGUF structure, vocabulary rules,
llama.cpp's vocab-only load in a child process) before any manifest names it.
"""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

from ..errors import Code, DomainError
from .gguf_check import GGUFError
from .store import FileMissing, FileTooLarge, Manifest, ModelStore, NameTaken, NoSpace, OutsideDirectory, StoreError, \
    valid_model_id
from .vocab_check import VocabError

GIB = 1 << 30
MAX_PATH = 4096
_NOT_NAME = re.compile(r"[^a-z0-9._-]+")

_CODES = {NameTaken: Code.TAKEN, FileTooLarge: Code.TOO_LARGE, NoSpace: Code.INSUFFICIENT_MEMORY,
          OutsideDirectory: Code.FORBIDDEN, FileMissing: Code.NOT_FOUND}


def looks_like_path(entry: str) -> bool:
    """A `models.preload` entry that names a file rather than a model of the store."""
    return entry.startswith(("/", "./", "../", "~")) or entry.endswith(".gguf")


def name_for(path: str) -> str:
    """The model name a file gets when none is given: its file name without `.gguf`, in the
    characters a model name may hold ("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf" ->
    "qwen2.5-0.5b-instruct-q4_k_m")."""
    stem = os.path.basename(path)
    if stem.lower().endswith(".gguf"):
        stem = stem[:-5]
    name = _NOT_NAME.sub("-", stem.lower()).strip("._-")[:64].rstrip("._-")
    if not valid_model_id(name):
        raise DomainError(Code.INVALID, f"no model name can be made from the file name {stem[:64]!r}: "
                                        "give one (--name, or \"name\" in the request)", param="name")
    return name


def check_name(name: str) -> str:
    """A name a local model may take: name[:tag] or namespace/name[:tag], never a registry host."""
    if not valid_model_id(name) or name.count("/") > 1:
        raise DomainError(Code.INVALID, "model names are name[:tag] or namespace/name[:tag]: lower-case "
                                        "letters, digits, '.', '_', '-' (1-64 each), a tag of up to 128 "
                                        "of those and upper-case letters", param="name")
    return name


def resolve_under(directory: str, requested: str) -> str:
    """`requested` (relative to `directory`, or absolute) resolved, and checked to lie under the
    resolved `directory`: a path outside it is refused (403), whatever it points to."""
    if not isinstance(requested, str) or not requested or len(requested) > MAX_PATH or "\x00" in requested:
        raise DomainError(Code.INVALID, f"path: 1-{MAX_PATH} characters, no NUL", param="path")
    root = os.path.realpath(directory)
    candidate = os.path.realpath(os.path.join(root, requested))
    if candidate == root or os.path.commonpath([root, candidate]) != root:
        raise DomainError(Code.FORBIDDEN, "the path is outside the import directory (models.import_dir); "
                                          "only files under it can be imported", param="path")
    return candidate


def refusal(exc: Exception, path: str) -> DomainError:
    """What the store said, as the domain error the API answers with."""
    shown = os.path.basename(path)
    if isinstance(exc, VocabError):
        return DomainError(Code.INVALID, f"import refused: {shown} cannot be loaded by llama.cpp: {exc}",
                           param="path")
    if isinstance(exc, GGUFError):
        return DomainError(Code.INVALID, f"import refused: {shown} is not a valid GGUF model: {exc}",
                           param="path")
    for kind, code in _CODES.items():
        if isinstance(exc, kind):
            return DomainError(code, str(exc), param="name" if kind is NameTaken else "path")
    if isinstance(exc, OSError):          # reading the file or writing the store's copy
        code = Code.INSUFFICIENT_MEMORY if exc.errno == errno.ENOSPC else Code.UNAVAILABLE
        return DomainError(code, f"import of {shown} failed: {exc.strerror}")
    return DomainError(Code.INVALID, str(exc), param="path")


@dataclass
class LocalImports:
    """Adding local files to one store, within the settings' limits."""
    store: ModelStore
    import_dir: str
    max_bytes: int
    disk_reserve: int

    @classmethod
    def from_settings(cls, store: ModelStore, data_dir: str, models: dict) -> "LocalImports":
        return cls(store, os.path.abspath(models["import_dir"] or os.path.join(data_dir, "import")),
                   max_bytes=models["max_pull_gb"] * GIB, disk_reserve=models["disk_reserve_mb"] << 20)

    def add(self, path: str, name: str | None = None, *, within: str | None = None,
            replace: bool = False) -> Manifest:
        """Check and store the file (blocking: a copy, a hash and a child process); raises
        DomainError. `within`: the directory the file must lie in (a request's import)."""
        model_id = check_name(name) if name is not None else name_for(path)
        try:
            return self.store.import_file(model_id, path, source="local", replace=replace,
                                          max_bytes=self.max_bytes, disk_reserve=self.disk_reserve,
                                          within=within)
        except (GGUFError, StoreError, OSError) as exc:
            raise refusal(exc, path) from None

    def add_requested(self, requested: str, name: str | None = None) -> Manifest:
        """A request's import: a path under the import directory only."""
        return self.add(resolve_under(self.import_dir, requested), name, within=self.import_dir)

    def add_preloaded(self, entry: str) -> str:
        """A file named by `serve --model` or `models.preload`: stored (again, when the file
        changed) under its file name; -> the model's id."""
        path = os.path.abspath(os.path.expanduser(entry))
        return self.add(path, replace=True).id
