"""POST /api/embed (a string or a list; `truncate`, true by default, cuts an input to what the
model takes; the vectors L2-normalized, as Ollama's are) and the older POST /api/embeddings
(one `prompt`, one vector as the model gives it)."""
from __future__ import annotations

import time

from ...http.errors import ApiError, ErrorKind, invalid
from ...http.response import Response, json_response
from ...system import offload
from ..errors import of_event
from ..inference import generate as gen_jobs
from ..inference.embeddings import MAX_INPUTS
from . import loading, names, options as opts


def inputs_of(body: dict) -> list[str]:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and 0 < len(value) <= MAX_INPUTS and all(isinstance(v, str) for v in value):
        return value
    raise invalid(f"'input' must be a string or an array of 1 to {MAX_INPUTS} strings", "input")


async def vectors(ctx, request, model, texts: list[str], truncate: bool):
    """(the vectors, as a numpy array, one row per text; the prompt tokens counted)."""
    tokens = await gen_jobs.tokenized(model, texts, request, True, False,
                                      lambda i: invalid("'input' is not valid", "input"))
    for i, row in enumerate(tokens):
        if len(row) > model.max_input:
            if not truncate:
                raise ApiError(ErrorKind.CONTEXT_LENGTH_EXCEEDED,
                               f"'input[{i}]' has {len(row)} tokens; this model takes at most {model.max_input} "
                               "('truncate': true cuts it)", param="input")
            tokens[i] = row[:model.max_input]
        if not tokens[i]:
            raise invalid(f"'input[{i}]' is empty", "input")
    stream = await model.runner.embed(tokens, gen_jobs.owner_of(request))
    try:
        event = await stream.__anext__()
    finally:
        model.runner.cancel(stream)
    if event.embedding is None:
        raise of_event(event.error)
    return event.embedding.reshape(len(tokens), model.engine.n_embd), event.n_prompt


def _normalized(rows):
    import numpy as np
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.where(norms > 0, norms, 1.0)).tolist()


async def embed(ctx, request) -> Response:
    started = time.monotonic_ns()
    body = request.json()
    model_id = loading.resolve(ctx, body)
    texts = inputs_of(body)
    truncate = body.get("truncate")
    truncate = True if truncate is None else truncate
    if not isinstance(truncate, bool):
        raise invalid("'truncate' must be a boolean", "truncate")
    opts.read_options(body)
    got = await loading.model_for(ctx, model_id, "embedding", None, opts.keep_alive_of(body))
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != got.model.engine.n_embd:
        raise invalid(f"'dimensions' is not supported: this model's embeddings have {got.model.engine.n_embd} "
                      "dimensions, and stackd does not shorten them", "dimensions")
    rows, n_prompt = await vectors(ctx, request, got.model, texts, truncate)
    embeddings = await offload.run(_normalized, rows) if len(rows) > 32 else _normalized(rows)
    return json_response({"model": names.shown(model_id), "embeddings": embeddings,
                          "total_duration": time.monotonic_ns() - started, "load_duration": got.load_ns,
                          "prompt_eval_count": n_prompt})


async def embeddings(ctx, request) -> Response:
    body = request.json()
    model_id = loading.resolve(ctx, body)
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise invalid("'prompt' must be a string", "prompt")
    opts.read_options(body)
    got = await loading.model_for(ctx, model_id, "embedding", None, opts.keep_alive_of(body))
    if not prompt:
        return json_response({"embedding": []})
    rows, _ = await vectors(ctx, request, got.model, [prompt], True)
    return json_response({"embedding": rows[0].tolist()})
