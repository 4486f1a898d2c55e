"""The inference group (port 8080): OpenAI-compatible chat, completions, embeddings, models;
OpenAI's Responses and Anthropic's Messages over the same chat path."""
from __future__ import annotations

from ...auth import permissions as perm
from ...http.openapi import json_answer
from ...http.response import Response, json_response
from ...http.routing import Endpoint
from ...http.validate import Body
from ...store.defaults import CHAT_MODEL, EMBEDDING_MODEL
from ..models import MODEL_LIST_SCHEMA, MODEL_SCHEMA
from . import (anthropic_messages, chat, completions, dialect_schemas, embeddings, openai_responses, params,
               schemas)

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
RESPONSES_BODY = Body(openai_responses.FIELDS, example={
    "model": CHAT_MODEL, "input": "Say hello.", "max_output_tokens": 8})
MESSAGES_BODY = Body(anthropic_messages.FIELDS, example={
    "model": CHAT_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]})
COUNT_TOKENS_BODY = Body(anthropic_messages.COUNT_FIELDS, example={
    "model": CHAT_MODEL, "messages": [{"role": "user", "content": "Say hello."}]})
# Anthropic's routes: its error shape, and the key also as x-api-key
ANTHROPIC = {"error_shape": anthropic_messages.ERROR_SHAPE, "credential_header": b"x-api-key"}

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
    ("POST", "/v1/responses"): Endpoint(
        openai_responses.create, perm.INFERENCE, INFERENCE, body=RESPONSES_BODY,
        summary="OpenAI Responses (stateless)",
        responses={200: dialect_schemas.RESPONSE_ANSWER, **schemas.MODEL_ERRORS}),
    ("POST", "/v1/messages"): Endpoint(
        anthropic_messages.messages, perm.INFERENCE, INFERENCE, body=MESSAGES_BODY,
        summary="Anthropic Messages", **ANTHROPIC,
        responses={200: dialect_schemas.MESSAGE_ANSWER, **schemas.MODEL_ERRORS}),
    ("POST", "/v1/messages/count_tokens"): Endpoint(
        anthropic_messages.count_tokens, perm.INFERENCE, INFERENCE, body=COUNT_TOKENS_BODY,
        summary="Anthropic token count", **ANTHROPIC,
        responses={200: dialect_schemas.TOKEN_COUNT, **schemas.MODEL_ERRORS}),
    ("GET", "/v1/models"): Endpoint(list_models, perm.INFERENCE, INFERENCE, responses={
        200: json_answer(MODEL_LIST_SCHEMA, "The models of the store.")}),
    ("GET", "/v1/models/:id"): Endpoint(get_model, perm.INFERENCE, INFERENCE, responses={
        200: json_answer(MODEL_SCHEMA, "The model."), 400: "The id is not a valid model id.",
        404: "The model is not in the store."}),
}
