"""The inference group (port 8080): OpenAI-compatible chat, completions, embeddings, models."""
from __future__ import annotations

from ..auth import permissions as perm
from ..http.response import Response, json_response
from ..http.routing import Endpoint
from .chat import chat_completions
from .completions import completions
from .embeddings import embeddings
from .failures import answers_engine_errors

INFERENCE = "inference"


def list_models(node, request) -> Response:
    """Every model in the store, with its kind and state (available, loading, loaded, ...)."""
    return json_response({"object": "list", "data": node.models.listing()})


def get_model(node, request) -> Response:
    return json_response(node.models.describe(node.models.manifest(request.params["id"])))


ROUTES = {
    ("POST", "/v1/chat/completions"): Endpoint(answers_engine_errors(chat_completions), perm.INFERENCE, INFERENCE),
    ("POST", "/v1/completions"): Endpoint(answers_engine_errors(completions), perm.INFERENCE, INFERENCE),
    ("POST", "/v1/embeddings"): Endpoint(answers_engine_errors(embeddings), perm.INFERENCE, INFERENCE),
    ("GET", "/v1/models"): Endpoint(list_models, perm.INFERENCE, INFERENCE),
    ("GET", "/v1/models/:id"): Endpoint(get_model, perm.INFERENCE, INFERENCE),
}
