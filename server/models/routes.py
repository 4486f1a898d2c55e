"""The model-management group, served on both ports and counted against the
cluster rate-limit group. The model store arrives with its own issue; until then
each operation validates its body and answers 501."""
from __future__ import annotations

from ..auth import permissions as perm
from ..http import validate
from ..http.errors import ApiError, ErrorKind
from ..http.response import Response
from ..http.routing import Endpoint

CLUSTER = "cluster"


def _not_yet(operation: str) -> ApiError:
    return ApiError(ErrorKind.NOT_IMPLEMENTED,
                    f"model {operation} is not available yet: this build has no model store")


def load(node, request) -> Response:
    body = request.json()
    validate.string(body, "model", max_len=256)
    options = validate.obj(body, "options", default={})
    validate.integer(options, "context_length", lo=1, hi=1 << 24)
    raise _not_yet("load")


def unload(node, request) -> Response:
    validate.string(request.json(), "model", max_len=256)
    raise _not_yet("unload")


def pull(node, request) -> Response:
    validate.string(request.json(), "model", max_len=256)
    raise _not_yet("pull")


ROUTES = {
    ("POST", "/v1/models/load"): Endpoint(load, perm.MODELS_MANAGE, CLUSTER),
    ("POST", "/v1/models/unload"): Endpoint(unload, perm.MODELS_MANAGE, CLUSTER),
    ("POST", "/v1/models/pull"): Endpoint(pull, perm.MODELS_MANAGE, CLUSTER),
}
