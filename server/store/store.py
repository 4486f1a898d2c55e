"""The model store: content-addressed blobs and one manifest per model.

    DATA_DIR/models/blobs/sha256-<hex>           the GGUF (and template/params layers)
    DATA_DIR/models/manifests/<sha256(id)>.json  id, file, size, sha256, GGUF facts, source

Model ids are validated against a fixed character set and length before they touch a
path, and even then a manifest's file name is a hash of the id, never the id itself.
Blob paths are built only from a validated sha256 digest. Nothing outside the blobs
directory is ever opened as a model.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field

import orjson

from ..system.files import write_private_file
from . import vocab_check
from .gguf_check import GGUFError

MODEL_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}(/[a-z0-9][a-z0-9._-]{0,63})?(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?")
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
HASH_CHUNK = 4 << 20


class StoreError(ValueError):
    pass


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
        return manifest

    # ---- adding models ----------------------------------------------------------------------

    def manifest_for_blob(self, model_id: str, hex_digest: str, *, source: str,
                          reference: str | None = None, extra: dict | None = None) -> Manifest:
        """Check a blob already in the store as a model llama.cpp can load, and describe it
        (raises GGUFError). The default models are the project's own pinned files: their
        vocabulary gets the rules, not the slower load in a child process."""
        path = self.blob_path(hex_digest)
        info = vocab_check.check_model_file(path, load=source != "default")
        return Manifest(
            id=model_id, file=os.path.relpath(path, self.root), size=info.file_size, sha256=hex_digest,
            architecture=info.architecture, kind=info.kind, quantization=info.quantization,
            parameter_count=info.parameter_count, context_length=info.context_length,
            n_layer=info.block_count, n_embd=info.embedding_length, n_head_kv=info.head_count_kv,
            n_head=info.head_count, source=source, reference=reference, extra=dict(extra or {}),
            created=int(time.time()), vocab_checked=True)

    def ensure_loadable(self, manifest: Manifest) -> Manifest:
        """Before a load: a manifest written by an older version was never vocabulary-checked;
        check its model now (raises GGUFError) and record that it passed."""
        if manifest.vocab_checked:
            return manifest
        vocab_check.check_model_file(self.model_path(manifest), load=manifest.source != "default")
        manifest.vocab_checked = True
        self.put(manifest)
        return manifest

    def import_file(self, model_id: str, path: str, *, source: str = "default") -> Manifest:
        """Bring a local GGUF into the store (hard link when possible, else a copy)."""
        existing = self.get(model_id)
        if existing is not None and os.path.exists(self.blob_path(existing.sha256)) \
                and os.path.getsize(self.blob_path(existing.sha256)) == os.path.getsize(path):
            return existing
        hex_digest = file_sha256(path)
        blob = self.blob_path(hex_digest)
        added = not os.path.exists(blob)
        if added:
            tmp = f"{blob}.partial"
            try:
                os.link(path, tmp)
            except OSError:
                shutil.copyfile(path, tmp)
            os.replace(tmp, blob)
        try:
            manifest = self.manifest_for_blob(model_id, hex_digest, source=source)
        except GGUFError:
            if added:                       # refused: nothing of it stays in the store
                os.unlink(blob)
            raise
        self.put(manifest)
        return manifest
