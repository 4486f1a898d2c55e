"""POST /v1/embeddings."""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import orjson

from ...http import validate
from ...http.errors import ApiError, ErrorKind, invalid
from ...http.response import Response
from ...http.wire import JSON
from ..errors import of_event
from . import generate, params
from ...system import offload

if TYPE_CHECKING:            # vectors arrive as numpy arrays; numpy loads with the first of them
    import numpy as np

MAX_INPUTS = 2048


INPUT = validate.OneOf(
    "input", validate.String(max_len=None), validate.Tokens(),
    validate.Array(items=validate.OneOf("", validate.String(max_len=None), validate.Tokens()),
                   min_items=1, max_items=MAX_INPUTS),
    required=True, flat=True,
    doc="A string, an array of strings, a token array, or an array of token arrays.",
    message="'input' must be a non-empty string, an array of strings, or token arrays")
ENCODING_FORMAT = validate.String("encoding_format", choices=("float", "base64"), default="float")
DIMENSIONS = validate.Integer("dimensions", lo=1, hi=1 << 16,
                              doc="Must equal the model's embedding size, when given.")
FIELDS = [params.MODEL, INPUT, ENCODING_FORMAT, DIMENSIONS, params.USER]


async def inputs_of(body: dict, model, request) -> list[list[int]]:
    """A string, a list of strings, a token array, or a list of token arrays (INPUT), tokenized
    by the model's runner, each within the model's input size."""
    raw = INPUT.read(body)
    if isinstance(raw, str) or validate.is_tokens(raw):
        raw = [raw]
    inputs = await generate.tokenized(model, raw, request, True, False, lambda i: invalid(
        f"'input[{i}]' has token ids outside the vocabulary", "input"))
    for i, tokens in enumerate(inputs):
        if len(tokens) > model.max_input:
            raise ApiError(ErrorKind.CONTEXT_LENGTH_EXCEEDED,
                           f"'input[{i}]' has {len(tokens)} tokens; this model takes at most "
                           f"{model.max_input}", param="input")
    return inputs


async def embeddings(ctx, request) -> Response:
    body = request.json()
    model = await ctx.models.get(params.MODEL.read(body), "embedding")
    encoding = ENCODING_FORMAT.read(body)
    dimensions = DIMENSIONS.read(body)
    if dimensions is not None and dimensions != model.engine.n_embd:
        raise invalid(f"this model's embeddings have {model.engine.n_embd} dimensions; "
                      "other sizes are not supported", "dimensions")
    params.USER.read(body)
    inputs = await inputs_of(body, model, request)

    stream = await model.runner.embed(inputs, generate.owner_of(request))
    try:
        event = await stream.__anext__()
    finally:
        model.runner.cancel(stream)
    embedding = event.embedding
    if embedding is None:
        raise of_event(event.error)
    vectors = embedding.reshape(len(inputs), model.engine.n_embd)
    if len(vectors) <= SERIALIZE_ON_LOOP:
        payload = _payload(vectors, encoding, model.id, event.n_prompt)
    else:
        payload = await offload.run(_payload, vectors, encoding, model.id, event.n_prompt)
    return Response(200, payload, JSON)


# Up to this many vectors the answer is serialized on the loop (tens of microseconds). Larger
# ones (2,048 x 384 floats is some 30 ms of formatting) go to an offload thread, one vector per
# orjson call, so the GIL comes back to the loop between vectors instead of after all of them.
SERIALIZE_ON_LOOP = 32


def _payload(vectors: np.ndarray, encoding: str, model_id: str, n_tokens: int) -> bytes:
    items = [orjson.dumps({"object": "embedding", "index": i, "embedding": _encode(v, encoding)},
                          option=orjson.OPT_SERIALIZE_NUMPY) for i, v in enumerate(vectors)]
    tail = orjson.dumps({"model": model_id,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})
    return b'{"object":"list","data":[' + b",".join(items) + b"]," + tail[1:]


def _encode(vector: np.ndarray, encoding: str):
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector
