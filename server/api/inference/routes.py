"""The inference group (port 8080): OpenAI-compatible chat, completions, embeddings, models."""
from __future__ import annotations

from ...auth import permissions as perm
from ...http.openapi import json_answer
from ...http.response import Response, json_response
from ...http.routing import Endpoint
from ...http.validate import Body
from ...store.defaults import CHAT_MODEL, EMBEDDING_MODEL
from ..models import MODEL_LIST_SCHEMA, MODEL_SCHEMA
from . import chat, completions, embeddings, params, schemas

INFERENCE = "inference"


def list_models(ctx, request) -> Response:
    """Every model in the store, with its kind and state (available, loading, loaded, ...)."""
    return json_response({"object": "list", "data": ctx.models.listing()})


def get_model(ctx, request) -> Response:
    """One model of the store, with its kind and state."""
    return json_response(ctx.models.describe(ctx.models.manifest(request.params["id"])))


CHAT_BODY = Body(params.MODEL, chat.MESSAGES, params.CHAT, example={
    "model": CHAT_MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8})
COMPLETION_BODY = Body(params.MODEL, completions.PROMPT, completions.ECHO, params.COMPLETION,
                       example={"model": CHAT_MODEL, "prompt": "Once upon a time", "max_tokens": 8})
EMBEDDING_BODY = Body(embeddings.FIELDS, example={"model": EMBEDDING_MODEL, "input": "hello"})

ROUTES = {
    ("POST", "/v1/chat/completions"): Endpoint(
        chat.chat_completions, perm.INFERENCE, INFERENCE, body=CHAT_BODY,
        summary="Chat completion", responses={200: schemas.CHAT_ANSWER, **schemas.MODEL_ERRORS}),
    ("POST", "/v1/completions"): Endpoint(
        completions.completions, perm.INFERENCE, INFERENCE, body=COMPLETION_BODY,
        summary="Text completion",
        responses={200: schemas.COMPLETION_ANSWER, **schemas.MODEL_ERRORS}),
    ("POST", "/v1/embeddings"): Endpoint(
        embeddings.embeddings, perm.INFERENCE, INFERENCE, body=EMBEDDING_BODY,
        summary="Embeddings of one or more inputs",
        responses={200: json_answer(schemas.EMBEDDINGS, "One embedding per input, in order."),
                   **schemas.MODEL_ERRORS}),
    ("GET", "/v1/models"): Endpoint(list_models, perm.INFERENCE, INFERENCE, responses={
        200: json_answer(MODEL_LIST_SCHEMA, "The models of the store.")}),
    ("GET", "/v1/models/:id"): Endpoint(get_model, perm.INFERENCE, INFERENCE, responses={
        200: json_answer(MODEL_SCHEMA, "The model."), 400: "The id is not a valid model id.",
        404: "The model is not in the store."}),
}
