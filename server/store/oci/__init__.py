"""Pulling models from an OCI distribution registry, the way Ollama's registry serves them.

- reference.py: model references and digests, parsed and validated; PullError.
- client.py: the registry client (manifests, bearer-token challenges, redirects) and the
  manifests it answers.
- puller.py: a blob's resumable, verified download, and the puller that runs a whole pull,
  shares in-flight downloads and reports Ollama-shaped progress.

The names below are the package's API (`from stackd.store import oci`, then `oci.<name>`).
"""
from __future__ import annotations

from .client import (MANIFEST_ACCEPT, MANIFEST_DOCKER_V2, MANIFEST_OCI_V1, MAX_LAYERS, MAX_MANIFEST_BYTES,
                     MAX_REDIRECTS, MAX_TOKEN_BYTES, MEDIA_MODEL, Layer, Manifest, RegistryClient,
                     parse_challenge, parse_manifest)
from .puller import (HASH_CHUNK, MAX_BATCHES_IN_FLIGHT, PROGRESS_INTERVAL, WRITE_BATCH, BlobDownloads,
                     Puller, check_disk)
from .reference import DIGEST_RE, MAX_REFERENCE, PullError, Reference, looks_like_host, parse_reference

__all__ = [
    "BlobDownloads", "DIGEST_RE", "HASH_CHUNK", "Layer", "MANIFEST_ACCEPT", "MANIFEST_DOCKER_V2",
    "MANIFEST_OCI_V1", "MAX_BATCHES_IN_FLIGHT", "MAX_LAYERS", "MAX_MANIFEST_BYTES", "MAX_REDIRECTS",
    "MAX_REFERENCE", "MAX_TOKEN_BYTES", "MEDIA_MODEL", "Manifest", "PROGRESS_INTERVAL", "PullError",
    "Puller", "Reference", "RegistryClient", "WRITE_BATCH", "check_disk", "looks_like_host",
    "parse_challenge", "parse_manifest", "parse_reference",
]
