"""POST /v1/embeddings."""
from __future__ import annotations

import base64

import numpy as np
import orjson

from ..http import validate
from ..http.errors import ApiError, ErrorKind, invalid
from ..http.response import Response
from ..http.wire import JSON
from . import failures, generate

MAX_INPUTS = 2048


def _is_tokens(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def inputs_of(body: dict, model) -> list[list[int]]:
    """A string, a list of strings, a token array, or a list of token arrays."""
    raw = body.get("input")
    if isinstance(raw, str) or _is_tokens(raw):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise invalid("'input' must be a non-empty string, an array of strings, or token arrays",
                      "input")
    if len(raw) > MAX_INPUTS:
        raise invalid(f"'input' may hold at most {MAX_INPUTS} items", "input")
    engine = model.engine
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            if not item:
                raise invalid(f"'input[{i}]' is an empty string", "input")
            tokens = engine.tokenize(item, True, False)
        elif _is_tokens(item):
            if not all(0 <= t < engine.n_vocab for t in item):
                raise invalid(f"'input[{i}]' has token ids outside the vocabulary", "input")
            tokens = list(item)
        else:
            raise invalid(f"'input[{i}]' must be a string or an array of token ids", "input")
        if len(tokens) > model.max_input:
            raise ApiError(ErrorKind.CONTEXT_LENGTH_EXCEEDED,
                           f"'input[{i}]' has {len(tokens)} tokens; this model takes at most "
                           f"{model.max_input}", param="input")
        out.append(tokens)
    return out


async def embeddings(node, request) -> Response:
    body = request.json()
    model = await node.models.get(validate.string(body, "model", max_len=256), "embedding")
    encoding = validate.string(body, "encoding_format", required=False, default="float", max_len=16)
    if encoding not in ("float", "base64"):
        raise invalid("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = validate.integer(body, "dimensions", lo=1, hi=1 << 16)
    if dimensions is not None and dimensions != model.engine.n_embd:
        raise invalid(f"this model's embeddings have {model.engine.n_embd} dimensions; "
                      "other sizes are not supported", "dimensions")
    validate.string(body, "user", required=False, max_len=512, allow_empty=True)
    inputs = await generate.tokenized(model, lambda b, _engine: inputs_of(b, model), body, request)

    stream = await model.runner.embed(inputs, generate.owner_of(request))
    try:
        event = await stream.__anext__()
    finally:
        model.runner.cancel(stream)
    embedding = event.embedding
    if embedding is None:
        raise failures.of_event(event.error)
    vectors = embedding.reshape(len(inputs), model.engine.n_embd)
    data = [{"object": "embedding", "index": i, "embedding": _encode(v, encoding)}
            for i, v in enumerate(vectors)]
    n_tokens = event.n_prompt
    body = {"object": "list", "data": data, "model": model.id,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
    return Response(200, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), JSON)


def _encode(vector: np.ndarray, encoding: str):
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector
