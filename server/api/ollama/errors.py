"""Ollama's error shape: `{"error": "<message>"}`, what its clients read (the official client's
ResponseError takes `error` as the message). The statuses stay stackd's: 400 for a bad body, 404
for a model not in the store, 401/403/429 from the guard, 503 while a model cannot answer yet;
never a 500 for what a client sent."""
from __future__ import annotations

from ...http.errors import ApiError, ErrorShape


def error_body(err: ApiError) -> dict:
    return {"error": err.message}


ERROR_SHAPE = ErrorShape("OllamaError", error_body, {
    "type": "object", "required": ["error"], "description": "Ollama's error shape.",
    "properties": {"error": {"type": "string"}}})


def error_line(err: ApiError) -> dict:
    """A stream's last line when it fails after its head was sent (Ollama's clients raise it)."""
    return error_body(err)
