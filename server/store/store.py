"""The model store: content-addressed blobs and one manifest per model.

    DATA_DIR/models/blobs/sha256-<hex>           the GGUF (and template/params layers)
    DATA_DIR/models/manifests/<sha256(id)>.json  id, file, size, sha256, GGUF facts, source

Model ids are validated against a fixed character set and length before they touch a
path, and even then a manifest's file name is a hash of the id, never the id itself.
Blob paths are built only from a validated sha256 digest. Nothing outside the blobs
directory is ever opened as a model.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field

import orjson

from ..system.files import write_private_file
from . import vocab_check

# A registry host (a name with a dot or a port, or localhost), as Ollama writes it: only in front
# of namespace/name, so that "ns/name" never reads as a host.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
HOST = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?"
_NAME = r"[a-z0-9][a-z0-9._-]{0,63}"
MODEL_ID = re.compile(rf"(?:(?:(?=[^/]*[.:]|localhost[:/]){HOST}/{_NAME}/)|(?:{_NAME}/))?{_NAME}"
                      r"(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?")
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
HASH_CHUNK = 4 << 20


class StoreError(ValueError):
    pass


class NameTaken(StoreError):
    """Another model already has this name."""


class FileTooLarge(StoreError):
    """Larger than models.max_pull_gb."""


class NoSpace(StoreError):
    """A copy would leave less than models.disk_reserve_mb free."""


class OutsideDirectory(StoreError):
    """The file opened does not lie in the directory it had to."""


class FileMissing(StoreError):
    """No file at that path."""


def valid_model_id(model_id: str) -> bool:
    return isinstance(model_id, str) and len(model_id) <= 200 and MODEL_ID.fullmatch(model_id) is not None


@dataclass
class Manifest:
    id: str
    file: str                      # blobs/sha256-<hex>, relative to the store root
    size: int
    sha256: str
    architecture: str
    kind: str                      # chat or embedding
    quantization: str
    parameter_count: int
    context_length: int | None     # the context the model was trained with
    n_layer: int | None = None
    n_embd: int | None = None
    n_head_kv: int | None = None
    n_head: int | None = None
    source: str = "default"        # default, registry or local
    reference: str | None = None   # registry reference it was pulled from
    extra: dict = field(default_factory=dict)   # media type -> digest of template/params layers
    created: int = 0
    vocab_checked: bool = False    # false in manifests of older stores: checked before a load
    origin: dict | None = None     # a local file's path, size, mtime_ns, inode, device when added

    def to_json(self) -> dict:
        return asdict(self)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class ModelStore:
    def __init__(self, data_dir: str):
        os.makedirs(data_dir, mode=0o700, exist_ok=True)   # keys live here too: private from birth
        self.root = os.path.join(data_dir, "models")
        self.blobs = os.path.join(self.root, "blobs")
        self.manifests = os.path.join(self.root, "manifests")
        # the prompt cache's files (native/engine/prompt_cache.h): a directory per blob digest,
        # removed with the blob
        self.prompt_cache = os.path.join(self.root, "kv")
        os.makedirs(self.blobs, exist_ok=True)
        os.makedirs(self.manifests, exist_ok=True)

    # ---- paths ------------------------------------------------------------------------------

    def blob_path(self, hex_digest: str) -> str:
        if not HEX_DIGEST.fullmatch(hex_digest):
            raise StoreError(f"not a sha256 digest: {hex_digest[:80]!r}")
        return os.path.join(self.blobs, f"sha256-{hex_digest}")

    def model_path(self, manifest: Manifest) -> str:
        """The model's GGUF, checked to be a blob of this store."""
        path = self.blob_path(manifest.sha256)
        if os.path.realpath(path) != os.path.join(os.path.realpath(self.blobs), f"sha256-{manifest.sha256}"):
            raise StoreError(f"model {manifest.id}: blob path escapes the store")
        return path

    def prompt_cache_dir(self, hex_digest: str) -> str:
        """Where the prompt cache keeps the saved prefixes of the model in blob `hex_digest`."""
        if not HEX_DIGEST.fullmatch(hex_digest):
            raise StoreError(f"not a sha256 digest: {hex_digest[:80]!r}")
        return os.path.join(self.prompt_cache, hex_digest)

    def _manifest_path(self, model_id: str) -> str:
        if not valid_model_id(model_id):
            raise StoreError("model ids are 1-200 characters: lower-case letters, digits, '.', '_', "
                             "'-', an optional 'namespace/' and an optional ':tag'")
        return os.path.join(self.manifests, hashlib.sha256(model_id.encode()).hexdigest() + ".json")

    # ---- manifests --------------------------------------------------------------------------

    def get(self, model_id: str) -> Manifest | None:
        try:
            with open(self._manifest_path(model_id), "rb") as f:
                raw = orjson.loads(f.read())
        except FileNotFoundError:
            return None
        manifest = Manifest(**raw)
        return manifest if manifest.id == model_id else None

    def list(self) -> list[Manifest]:
        out = []
        for name in sorted(os.listdir(self.manifests)):
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.manifests, name), "rb") as f:
                    out.append(Manifest(**orjson.loads(f.read())))
            except (OSError, ValueError, TypeError):
                continue            # a damaged manifest hides its model; it never breaks listing
        return sorted(out, key=lambda m: m.id)

    def put(self, manifest: Manifest) -> None:
        write_private_file(self._manifest_path(manifest.id), orjson.dumps(manifest.to_json(),
                                                                          option=orjson.OPT_INDENT_2))

    def remove(self, model_id: str) -> Manifest:
        manifest = self.get(model_id)
        if manifest is None:
            raise KeyError(model_id)
        os.unlink(self._manifest_path(model_id))
        still_used = {m.sha256 for m in self.list()} | {d.split(":")[-1] for m in self.list()
                                                         for d in m.extra.values()}
        for digest in [manifest.sha256, *[d.split(":")[-1] for d in manifest.extra.values()]]:
            if digest not in still_used:
                try:
                    os.unlink(self.blob_path(digest))
                except (FileNotFoundError, StoreError):
                    pass
                try:            # its saved prompt prefixes go with it
                    shutil.rmtree(self.prompt_cache_dir(digest), ignore_errors=True)
                except StoreError:
                    pass
        return manifest

    # ---- adding models ----------------------------------------------------------------------

    def manifest_for_blob(self, model_id: str, hex_digest: str, *, source: str,
                          reference: str | None = None, extra: dict | None = None) -> Manifest:
        """Check a blob already in the store as a model llama.cpp can load, and describe it
        (raises GGUFError)."""
        path = self.blob_path(hex_digest)
        return self._describe(model_id, hex_digest, _checked(path, source), source=source,
                              reference=reference, extra=extra)

    def _describe(self, model_id: str, hex_digest: str, info, *, source: str, reference: str | None = None,
                  extra: dict | None = None, origin: dict | None = None) -> Manifest:
        return Manifest(
            id=model_id, file=os.path.relpath(self.blob_path(hex_digest), self.root), size=info.file_size,
            sha256=hex_digest, architecture=info.architecture, kind=info.kind,
            quantization=info.quantization, parameter_count=info.parameter_count,
            context_length=info.context_length, n_layer=info.block_count, n_embd=info.embedding_length,
            n_head_kv=info.head_count_kv, n_head=info.head_count, source=source, reference=reference,
            extra=dict(extra or {}), created=int(time.time()), vocab_checked=True, origin=origin)

    def ensure_loadable(self, manifest: Manifest) -> Manifest:
        """Before a load: a manifest written by an older version was never vocabulary-checked;
        check its model now (raises GGUFError) and record that it passed."""
        if manifest.vocab_checked:
            return manifest
        _checked(self.model_path(manifest), manifest.source)
        manifest.vocab_checked = True
        self.put(manifest)
        return manifest

    def import_file(self, model_id: str, path: str, *, source: str = "default", replace: bool = True,
                    max_bytes: int | None = None, disk_reserve: int = 0,
                    within: str | None = None) -> Manifest:
        """Bring a local GGUF into the store, through every check a pulled model passes (raises
        GGUFError, or StoreError: NameTaken, FileTooLarge, NoSpace). A hard link when the file
        is on the store's filesystem and only this user may write it, else a copy hashed as it
        is written; either way the checks run on the store's own temp file, which takes its
        place (renamed atomically) only once they pass. A refused file leaves nothing behind.

        The same file again (path, size, mtime, inode) is recognised without reading it. A
        different file under a name the store holds replaces that model, or with replace=False
        raises NameTaken (the same bytes under the same name are no clash). `within`: a
        directory the opened file must lie in (OutsideDirectory), whatever its path pointed to
        by the time it was opened."""
        self._manifest_path(model_id)                              # the id, checked first
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO never blocks us
        except OSError as exc:
            kind = FileMissing if exc.errno == errno.ENOENT else StoreError
            raise kind(f"cannot open {os.path.basename(path)}: {exc.strerror}") from None
        try:
            if within is not None and not _lies_in(os.readlink(f"/proc/self/fd/{fd}"), within):
                raise OutsideDirectory(f"{os.path.basename(path)} is not in {within}")
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"{os.path.basename(path)} is not a regular file")
            origin = {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                      "inode": st.st_ino, "device": st.st_dev}
            existing = self.get(model_id)
            if existing is not None and existing.origin == origin and os.path.exists(self.blob_path(existing.sha256)):
                return existing
            if max_bytes is not None and st.st_size > max_bytes:
                raise FileTooLarge(f"{os.path.basename(path)} is {st.st_size} bytes, more than the {max_bytes} allowed "
                                   "(models.max_pull_gb)")
            tmp, hex_digest = self._take(fd, st, disk_reserve)
        finally:
            os.close(fd)
        try:
            if existing is not None and not replace and existing.sha256 != hex_digest:
                raise NameTaken(f"the store already has a model named {model_id!r} (a different file, "
                                f"sha256:{existing.sha256[:12]}): remove it first or choose another name")
            info = _checked(tmp, source)
            os.replace(tmp, self.blob_path(hex_digest))        # the same bytes, if it was there already
            _unlink(tmp)        # a no-op rename (both names one inode, as linked twice) leaves it
        except BaseException:
            _unlink(tmp)
            raise
        manifest = self._describe(model_id, hex_digest, info, source=source, origin=origin,
                                  reference=origin["path"] if source == "local" else None)
        self.put(manifest)
        return manifest

    def _take(self, fd: int, st: os.stat_result, disk_reserve: int) -> tuple[str, str]:
        """The opened file as a temp file of the blobs folder, and its sha256."""
        tmp = os.path.join(self.blobs, f".import-{os.getpid()}-{secrets.token_hex(8)}")
        blobs = os.stat(self.blobs)
        linkable = (st.st_dev == blobs.st_dev and st.st_uid == os.getuid()
                    and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
        if linkable:
            blobs_fd = os.open(self.blobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                # the inode we opened, whatever its path names now (a dir fd makes Python call
                # linkat with AT_SYMLINK_FOLLOW, which follows /proc's link to the open file)
                os.link(f"/proc/self/fd/{fd}", os.path.basename(tmp), dst_dir_fd=blobs_fd)
                return tmp, file_sha256(tmp)
            except OSError:
                _unlink(tmp)
            finally:
                os.close(blobs_fd)
        free = shutil.disk_usage(self.blobs).free
        if st.st_size + disk_reserve > free:
            raise NoSpace(f"copying {st.st_size} bytes would leave less than {disk_reserve} bytes free "
                          "(models.disk_reserve_mb)")
        digest = hashlib.sha256()
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            while chunk := os.read(fd, HASH_CHUNK):
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
            os.fsync(out)
        except BaseException:
            os.close(out)
            _unlink(tmp)
            raise
        os.close(out)
        return tmp, digest.hexdigest()


def _checked(path: str, source: str):
    """GGUF structure, vocabulary rules and, but for the project's own pinned default models,
    a vocab-only load by llama.cpp in a child process (raises GGUFError)."""
    return vocab_check.check_model_file(path, load=source != "default")


def _lies_in(path: str, directory: str) -> bool:
    root = os.path.realpath(directory)
    return path != root and os.path.commonpath([root, path]) == root


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
