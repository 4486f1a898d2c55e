"""The inference group (port 8080): OpenAI-compatible chat, completions, embeddings, models."""
from __future__ import annotations

from ..auth import permissions as perm
from ..http.errors import ApiError, ErrorKind
from ..http.response import Response, json_response
from ..http.routing import Endpoint
from .chat import chat_completions
from .completions import completions
from .embeddings import embeddings

INFERENCE = "inference"


def _describe(model) -> dict:
    return {"id": model.id, "object": "model", "created": model.created, "owned_by": "stackd",
            "kind": model.kind, "state": model.state, "context_length": model.context_length}


def list_models(node, request) -> Response:
    return json_response({"object": "list",
                          "data": [_describe(m) for m in node.models.loaded.values()]})


def get_model(node, request) -> Response:
    model = node.models.loaded.get(request.params["id"])
    if model is None:
        raise ApiError(ErrorKind.MODEL_NOT_FOUND, f"the model '{request.params['id']}' does not exist",
                       param="model")
    return json_response(_describe(model))


ROUTES = {
    ("POST", "/v1/chat/completions"): Endpoint(chat_completions, perm.INFERENCE, INFERENCE),
    ("POST", "/v1/completions"): Endpoint(completions, perm.INFERENCE, INFERENCE),
    ("POST", "/v1/embeddings"): Endpoint(embeddings, perm.INFERENCE, INFERENCE),
    ("GET", "/v1/models"): Endpoint(list_models, perm.INFERENCE, INFERENCE),
    ("GET", "/v1/models/:id"): Endpoint(get_model, perm.INFERENCE, INFERENCE),
}
