"""The inference group (port 8080). The engine arrives with the inference-engine issue;
until then generation endpoints answer 501 and the model list is honestly empty."""
from __future__ import annotations

from ..auth import permissions as perm
from ..http.errors import ApiError, ErrorKind
from ..http.response import Response, json_response
from ..http.routing import Endpoint

INFERENCE = "inference"


def not_yet(node, request) -> Response:
    request.json()          # a malformed body is still a 400, not a 501
    raise ApiError(ErrorKind.NOT_IMPLEMENTED,
                   f"{request.path} is not available yet: this build has no inference engine")


def list_models(node, request) -> Response:
    return json_response({"object": "list", "data": []})


ROUTES = {
    ("POST", "/v1/chat/completions"): Endpoint(not_yet, perm.INFERENCE, INFERENCE),
    ("POST", "/v1/completions"): Endpoint(not_yet, perm.INFERENCE, INFERENCE),
    ("POST", "/v1/embeddings"): Endpoint(not_yet, perm.INFERENCE, INFERENCE),
    ("GET", "/v1/models"): Endpoint(list_models, perm.INFERENCE, INFERENCE),
}
