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
               infill, schemas, tokenize)

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
TOKENIZE_BODY = Body(tokenize.FIELDS, example={"model": CHAT_MODEL, "prompt": "Hello, world"})
INFILL_BODY = Body(infill.FIELDS, example={
    "model": CHAT_MODEL, "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 8})
DETOKENIZE_BODY = Body(tokenize.DETOKENIZE_FIELDS, example={"model": CHAT_MODEL, "tokens": [19556, 28, 905]})
# Anthropic's routes: its error shape, and the key also as x-api-key
ANTHROPIC = {"error_shape": anthropic_messages.ERROR_SHAPE, "credential_header": b"x-api-key"}



def generation(handler, body: Body, summary: str, answer: dict, **extra) -> Endpoint:
    """A POST that runs a model: the inference permission and rate limit, and the model's errors;
    the model's work stops when the client goes, even by closing only its sending side."""
    return Endpoint(handler, perm.INFERENCE, INFERENCE, body=body, summary=summary,
                    responses={200: answer, **schemas.MODEL_ERRORS}, ends_with_client=True, **extra)


ROUTES = {
    ("POST", "/v1/chat/completions"): generation(
        chat.chat_completions, CHAT_BODY, "Chat completion", schemas.CHAT_ANSWER),
    ("POST", "/v1/completions"): generation(
        completions.completions, COMPLETION_BODY, "Text completion", schemas.COMPLETION_ANSWER),
    ("POST", "/v1/embeddings"): generation(
        embeddings.embeddings, EMBEDDING_BODY, "Embeddings of one or more inputs",
        json_answer(schemas.EMBEDDINGS, "One embedding per input, in order.")),
    ("POST", "/v1/responses"): generation(
        openai_responses.create, RESPONSES_BODY, "OpenAI Responses (stateless)",
        dialect_schemas.RESPONSE_ANSWER),
    ("POST", "/v1/messages"): generation(
        anthropic_messages.messages, MESSAGES_BODY, "Anthropic Messages", dialect_schemas.MESSAGE_ANSWER,
        **ANTHROPIC),
    ("POST", "/v1/messages/count_tokens"): generation(
        anthropic_messages.count_tokens, COUNT_TOKENS_BODY, "Anthropic token count",
        dialect_schemas.TOKEN_COUNT, **ANTHROPIC),
    ("POST", "/tokenize"): generation(
        tokenize.tokenize, TOKENIZE_BODY, "Tokenize a text or a conversation", schemas.TOKENIZED),
    ("POST", "/detokenize"): generation(
        tokenize.detokenize, DETOKENIZE_BODY, "Token ids back to text", schemas.DETOKENIZED),
    ("POST", "/infill"): generation(
        infill.infill, INFILL_BODY, "Fill in the middle (llama-server's /infill)", schemas.INFILL_ANSWER),
    ("GET", "/tokenizer_info"): Endpoint(tokenize.tokenizer_info, perm.INFERENCE, INFERENCE, summary=(
        "The tokenizer's special tokens, chat template and context (vLLM's, for lm-eval's remote "
        "tokenizer)"), responses={200: schemas.TOKENIZER_INFO, **schemas.MODEL_ERRORS}),
    # Anthropic-style clients list models with x-api-key too
    ("GET", "/v1/models"): Endpoint(list_models, perm.INFERENCE, INFERENCE, responses={
        200: json_answer(MODEL_LIST_SCHEMA, "The models of the store.")},
        credential_header=ANTHROPIC["credential_header"]),
    ("GET", "/v1/models/:id"): Endpoint(get_model, perm.INFERENCE, INFERENCE, responses={
        200: json_answer(MODEL_SCHEMA, "The model."), 400: "The id is not a valid model id.",
        404: "The model is not in the store."}, credential_header=ANTHROPIC["credential_header"]),
}
