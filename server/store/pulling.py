"""Pull a model from the configured registry into the store.

The OCI mechanics (manifests, bearer challenge, verified and resumable blob downloads,
shared in-flight downloads) live in oci/. This module adds the store's side: the GGUF
layer is checked with gguf_check and its vocabulary with vocab_check (llama.cpp loads it
in a child process) before any manifest names it, and a file that fails either check is
deleted, so a crafted model never reaches the daemon's llama.cpp.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import Code, DomainError
from . import oci
from .gguf_check import GGUFError
from .vocab_check import VocabError
from .store import Manifest, ModelStore, valid_model_id

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
    others: tuple[str, ...] = ()   # models.registries: the hosts a name may carry

    @classmethod
    def from_settings(cls, models: dict) -> "RegistrySettings":
        """From the settings' `models` section."""
        return cls(url=models["registry"], username=models["registry_username"] or None,
                   password=models["registry_password"] or None, max_bytes=models["max_pull_gb"] * GIB,
                   disk_reserve=models["disk_reserve_mb"] << 20, stall_timeout=models["pull_stall_timeout"],
                   others=tuple(models["registries"]))

    def base_url(self, host: str) -> str:
        """The registry a reference names: the configured one for no host (or its own host),
        else the entry of models.registries with that host[:port]; any other host is refused,
        so a request can make the daemon fetch only from registries the operator listed."""
        if not host or (self.url and _netloc(self.url) == host):
            if not self.url:
                raise DomainError(Code.INVALID, "no model registry is configured "
                                                "(set models.registry in the config or STACKD_MODELS_REGISTRY)")
            return self.url
        for url in self.others:
            if _netloc(url) == host:
                return url
        raise DomainError(Code.FORBIDDEN, f"pulls from the registry host {host!r} are not allowed: the operator "
                                          "lists the registries a name may name in models.registries",
                          param="model")


def _netloc(url: str) -> str:
    """host[:port] as a reference writes it: lower case, a scheme's default port left out."""
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}[parts.scheme]
    host = (parts.hostname or "").lower()
    return host if parts.port in (None, default) else f"{host}:{parts.port}"


def model_id_for(ref: oci.Reference) -> str:
    """Ollama's naming: 'name:tag' in the default namespace, 'ns/name:tag' elsewhere, and
    'host/ns/name:tag' for a model of a registry other than the configured one."""
    if ref.host:
        return f"{ref.host}/{ref.namespace}/{ref.name}:{ref.tag}"
    base = ref.name if ref.namespace == "library" else f"{ref.namespace}/{ref.name}"
    return f"{base}:{ref.tag}"


def refused(exc: oci.PullError) -> DomainError:
    code = _STATUS_CODE.get(exc.status, Code.UNAVAILABLE)
    return DomainError(code, f"pull failed: {exc}", param="model" if exc.status in (400, 404) else None)


class PullService:
    def __init__(self, store: ModelStore, settings: RegistrySettings):
        self.store = store
        self.settings = settings
        self._pullers: dict[str, oci.Puller] = {}     # base URL -> its puller

    def puller(self, host: str = "") -> oci.Puller:
        s = self.settings
        url = s.base_url(host)
        if url not in self._pullers:
            # credentials belong to the configured registry alone
            own = url == s.url
            self._pullers[url] = oci.Puller(
                lambda: oci.RegistryClient(url, username=s.username if own else None,
                                           password=s.password if own else None,
                                           stall_timeout=s.stall_timeout, max_blob_bytes=s.max_bytes),
                self.store.blobs, disk_reserve=s.disk_reserve)
        return self._pullers[url]

    async def pull(self, name: str):
        """Ollama-shaped progress dicts; the last is {"status": "success", "model": <id>}."""
        try:
            ref = oci.parse_reference(name)
        except oci.PullError as exc:
            raise refused(exc) from None
        puller = self.puller(ref.host)
        if ref.host and self.settings.base_url(ref.host) == self.settings.url:
            ref = dataclasses.replace(ref, host="")          # the configured registry: its plain name
        if not valid_model_id(model_id_for(ref)):
            raise DomainError(Code.INVALID, f"the model id {model_id_for(ref)[:64]!r}... would be longer than "
                                            "200 characters", param="model")
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
