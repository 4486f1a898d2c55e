"""/api/blobs/:digest: what Ollama's clients send before /api/create with `files`. HEAD (and
GET) say whether the store holds the blob; POST stores a body whose sha256 is the digest
(checked before anything is kept; written to a temporary file and renamed into place, as a
pull's blobs are). The blob is only bytes until /api/create checks it as a GGUF model.

The HTTP layer holds a request body in memory, so a blob is bounded (ollama.max_blob_mb); a
larger model goes in through the import directory (/api/create's `from` a .gguf path)."""
from __future__ import annotations

import hashlib
import os

from ...errors import Code, DomainError
from ...http.errors import invalid
from ...http.response import Response
from ...system import offload
from ...system.files import write_private_file
from .models import blob_hex


def _digest(params: dict) -> str:
    return blob_hex(params.get("digest"), "digest")


def exists(ctx, request) -> Response:
    path = ctx.models.store.blob_path(_digest(request.params))
    if not os.path.isfile(path):
        raise DomainError(Code.NOT_FOUND, "no such blob")
    return Response(200, b"", b"application/json")


def _store(path: str, hex_digest: str, body: bytes) -> None:
    if hashlib.sha256(body).hexdigest() != hex_digest:
        raise invalid("the body's sha256 is not the digest of the URL", "digest")
    if not os.path.exists(path):
        write_private_file(path, body)


async def upload(ctx, request) -> Response:
    hex_digest = _digest(request.params)
    body = request.body
    if not body:
        raise invalid("the blob is empty", "digest")
    await offload.run(_store, ctx.models.store.blob_path(hex_digest), hex_digest, body)
    return Response(201, b"", b"application/json")
