"""The Ollama port's route table (Ollama's server/routes.go, in its order): each route parses
and renders in its module; keys, permissions and rate-limit groups are port 8080's (generation
and listings are inference, the store's changes model management, counted as the cluster group
as on the other ports). Every error is in Ollama's shape."""
from __future__ import annotations

import dataclasses

from ...auth import permissions as perm
from ...http.routing import Endpoint
from ..inference.routes import INFERENCE
from ..models import CLUSTER
from . import blobs, chat, embed, generate, models
from .errors import ERROR_SHAPE

SHAPE = {"error_shape": ERROR_SHAPE}


def probe(handler, summary: str) -> Endpoint:
    """What clients ask before anything else, with or without a key (liveness, version)."""
    return Endpoint(handler, perm.PUBLIC, None, summary=summary, **SHAPE)


def listing(handler, summary: str) -> Endpoint:
    return Endpoint(handler, perm.INFERENCE, INFERENCE, summary=summary, **SHAPE)


def generation(handler, summary: str) -> Endpoint:
    """A model's work, which stops when its client goes."""
    return Endpoint(handler, perm.INFERENCE, INFERENCE, summary=summary, ends_with_client=True, **SHAPE)


def management(handler, summary: str, **extra) -> Endpoint:
    return Endpoint(handler, perm.MODELS_MANAGE, CLUSTER, summary=summary, **SHAPE, **extra)


BLOB_UPLOAD = ("POST", "/api/blobs/:digest")

ROUTES = {
    ("GET", "/"): probe(models.root, "Ollama is running"),
    ("GET", "/api/version"): probe(models.version, "The Ollama version this port answers as"),
    ("GET", "/api/tags"): listing(models.tags, "The models of the store"),
    ("POST", "/api/show"): listing(models.show, "A model's details, template and capabilities"),
    ("GET", "/api/ps"): listing(models.ps, "The loaded models and when each is unloaded"),
    ("POST", "/api/chat"): generation(chat.chat, "Chat (NDJSON unless stream is false)"),
    ("POST", "/api/generate"): generation(generate.generate, "Generate from a prompt (NDJSON unless stream is false)"),
    ("POST", "/api/embed"): generation(embed.embed, "Embeddings of a string or a list"),
    ("POST", "/api/embeddings"): generation(embed.embeddings, "One embedding (Ollama's older route)"),
    ("POST", "/api/pull"): management(models.pull, "Pull a model from the registry (NDJSON progress)"),
    ("POST", "/api/push"): management(models.push, "Refused: stackd does not publish models"),
    ("DELETE", "/api/delete"): management(models.delete, "Remove a model from memory and the store"),
    ("POST", "/api/copy"): management(models.copy, "Store a model under another name too"),
    ("POST", "/api/create"): management(models.create, "A model from a stored one, an import file or a blob"),
    ("GET", "/api/blobs/:digest"): management(blobs.exists, "Whether the store holds a blob (HEAD too)"),
    BLOB_UPLOAD: management(blobs.upload, "Send a blob for /api/create"),
}


def table(max_blob_bytes: int) -> dict:
    """ROUTES, a blob upload bounded by ollama.max_blob_mb (the HTTP layer holds a body whole)."""
    return {**ROUTES, BLOB_UPLOAD: dataclasses.replace(ROUTES[BLOB_UPLOAD], max_body=max_blob_bytes)}
