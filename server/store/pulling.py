"""Pull a model from the configured registry into the store.

The OCI mechanics (manifests, bearer challenge, verified and resumable blob downloads,
shared in-flight downloads) live in oci.py. This module adds the store's side: the GGUF
layer is checked with gguf_check and its vocabulary with vocab_check (llama.cpp loads it
in a child process) before any manifest names it, and a file that fails either check is
deleted, so a crafted model never reaches the daemon's llama.cpp.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from ..errors import Code, DomainError
from . import oci
from .gguf_check import GGUFError
from .vocab_check import VocabError
from .store import Manifest, ModelStore

GIB = 1 << 30

_STATUS_CODE = {400: Code.INVALID, 404: Code.MODEL_NOT_FOUND,
                413: Code.TOO_LARGE, 507: Code.INSUFFICIENT_MEMORY}


@dataclass
class RegistrySettings:
    url: str = ""
    username: str | None = None
    password: str | None = None
    max_bytes: int = 64 * GIB
    disk_reserve: int = GIB
    stall_timeout: float = 30.0

    @classmethod
    def from_settings(cls, models: dict) -> "RegistrySettings":
        """From the settings' `models` section."""
        return cls(url=models["registry"], username=models["registry_username"] or None,
                   password=models["registry_password"] or None, max_bytes=models["max_pull_gb"] * GIB,
                   disk_reserve=models["disk_reserve_mb"] << 20, stall_timeout=models["pull_stall_timeout"])


def model_id_for(ref: oci.Reference) -> str:
    """Ollama's naming: 'name:tag' in the default namespace, 'ns/name:tag' elsewhere."""
    base = ref.name if ref.namespace == "library" else f"{ref.namespace}/{ref.name}"
    return f"{base}:{ref.tag}"


def refused(exc: oci.PullError) -> DomainError:
    code = _STATUS_CODE.get(exc.status, Code.UNAVAILABLE)
    return DomainError(code, f"pull failed: {exc}", param="model" if exc.status in (400, 404) else None)


class PullService:
    def __init__(self, store: ModelStore, settings: RegistrySettings):
        self.store = store
        self.settings = settings
        self._puller: oci.Puller | None = None

    def puller(self) -> oci.Puller:
        if not self.settings.url:
            raise DomainError(Code.INVALID, "no model registry is configured "
                           "(set models.registry in the config or STACKD_MODELS_REGISTRY)")
        if self._puller is None:
            s = self.settings
            self._puller = oci.Puller(
                lambda: oci.RegistryClient(s.url, username=s.username, password=s.password,
                                           stall_timeout=s.stall_timeout, max_blob_bytes=s.max_bytes),
                self.store.blobs, disk_reserve=s.disk_reserve)
        return self._puller

    async def pull(self, name: str):
        """Ollama-shaped progress dicts; the last is {"status": "success", "model": <id>}."""
        try:
            ref = oci.parse_reference(name)
        except oci.PullError as exc:
            raise refused(exc) from None
        puller = self.puller()
        try:
            async for event in puller.pull(ref):
                if event.get("status") != "success":
                    yield event
                    continue
                manifest = await self._accept(ref, event["manifest"])
                yield {"status": "success", "model": manifest.id}
        except oci.PullError as exc:
            raise refused(exc) from None

    async def _accept(self, ref: oci.Reference, remote: oci.Manifest) -> Manifest:
        layer = remote.model_layer
        hex_digest = layer.digest.split(":", 1)[1]
        extra = {l.media_type: l.digest for l in remote.layers if l is not layer}
        loop = asyncio.get_running_loop()
        try:
            manifest = await loop.run_in_executor(None, lambda: self.store.manifest_for_blob(
                model_id_for(ref), hex_digest, source="registry", reference=str(ref), extra=extra))
        except GGUFError as exc:
            try:
                os.unlink(self.store.blob_path(hex_digest))
            except FileNotFoundError:
                pass
            why = "cannot be loaded by llama.cpp" if isinstance(exc, VocabError) else "is not a valid GGUF model"
            raise DomainError(Code.INVALID, f"pull refused: {ref} {why}: {exc}") from None
        self.store.put(manifest)
        return manifest
