"""The OpenAPI 3.1 document of a port, generated from its route tables.

Nothing here is written beside the routes: each path comes from a table's key, its body from
the `validate.Body` its endpoint reads, its answers from the endpoint's `responses` and from
what the guard and the HTTP layer can answer for it (401 always; 403 with a permission; 429
with a rate-limit group; 400, 413 and 415 with a JSON body). Every error shares one schema:
the spec's `{"error": {"code", "message", "type"}}`.

`routes(...)` is the table that serves the document at GET /openapi.json: any valid key may
read it (no permission), counted against the rate-limit group of the port it describes.
"""
from __future__ import annotations

import re

import orjson

from .errors import ErrorKind
from .response import Response
from .routing import Endpoint
from .wire import JSON

PATH = "/openapi.json"
ERROR_REF = {"$ref": "#/components/schemas/Error"}

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["code", "message", "type"],
        "properties": {
            "code": {"type": "integer", "description": "The HTTP status."},
            "message": {"type": "string"},
            "type": {"type": "string", "enum": sorted({kind.type for kind in ErrorKind})},
            "param": {"type": "string", "description": "The field at fault, when there is one."},
        },
    }},
}

# Why the guard and the HTTP layer answer with an error, whatever the endpoint.
GUARD_ERRORS = {
    401: "Missing, malformed or unknown API key.",
    403: "The API key lacks the permission this endpoint needs.",
    429: "Rate limit of the key's group exceeded; see Retry-After.",
}
BODY_ERRORS = {
    400: "Invalid request: the body is not a JSON object or a field is wrong (the message and "
         "`param` name it).",
    413: "The body is larger than the endpoint accepts.",
    415: "Content-Type is not application/json.",
}


def json_answer(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def event_stream(description: str, chunk: dict) -> dict:
    """Server-sent events whose `data` is a JSON `chunk`, the last one `[DONE]` (OpenAI's
    framing). In OpenAPI 3.1 an event stream's schema describes one event."""
    data = {"type": "string", "description": description,
            "if": {"const": "[DONE]"},
            "else": {"contentMediaType": "application/json", "contentSchema": chunk}}
    return {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"], "properties": {"data": data}}}}


def _path_template(path: str) -> tuple[str, list[str]]:
    names = re.findall(r":(\w+)", path)
    return re.sub(r":(\w+)", r"{\1}", path), names


def _error_answer(description: str, shape=None) -> dict:
    """`shape`: the endpoint's errors.ErrorShape (its schema is a component of its own name)."""
    ref = ERROR_REF if shape is None else {"$ref": f"#/components/schemas/{shape.name}"}
    return json_answer(ref, description)


def _responses(endpoint: Endpoint) -> dict:
    out: dict = {}
    shape = endpoint.error_shape
    for status, answer in endpoint.responses.items():
        out[str(status)] = _error_answer(answer, shape) if isinstance(answer, str) else answer
    errors = {401: GUARD_ERRORS[401]}
    if endpoint.permission is not None:
        errors[403] = GUARD_ERRORS[403]
    if endpoint.group is not None:
        errors[429] = GUARD_ERRORS[429]
    if endpoint.body is not None:
        errors.update(BODY_ERRORS)
    for status, description in errors.items():
        if str(status) in out:          # the endpoint says more: keep both reasons
            out[str(status)]["description"] += " " + description
        else:
            out[str(status)] = _error_answer(description, shape)
    return dict(sorted(out.items()))


def _operation(method: str, path: str, endpoint: Endpoint, names: list[str]) -> dict:
    doc = (endpoint.handler.__doc__ or "").strip()
    summary, _, details = doc.partition("\n")
    op: dict = {"operationId": f"{method.lower()}{re.sub(r'[^a-zA-Z0-9]+', '_', path)}".rstrip("_"),
                "summary": endpoint.summary or summary.strip() or f"{method} {path}"}
    needs = (f"Needs an API key with the '{endpoint.permission}' permission."
             if endpoint.permission else "Needs any valid API key.")
    op["description"] = " ".join(part for part in (" ".join(details.split()), needs) if part)
    if endpoint.permission:
        op["x-permission"] = endpoint.permission
    if endpoint.group:
        op["x-rate-limit-group"] = endpoint.group
    if endpoint.credential_header:
        op["security"] = [{"apiKey": []}, {endpoint.credential_header.decode(): []}]
        op["description"] += f" The key may also come as '{endpoint.credential_header.decode()}: <key>'."
    if names:
        op["parameters"] = [{"name": name, "in": "path", "required": True,
                             "schema": {"type": "string", "minLength": 1}} for name in names]
    if endpoint.body is not None:
        media: dict = {"schema": endpoint.body.schema()}
        if endpoint.body.example is not None:
            media["example"] = endpoint.body.example
        op["requestBody"] = {"required": True, "content": {"application/json": media}}
    op["responses"] = _responses(endpoint)
    return op


def document(title: str, tables: list[dict], *, version: str, description: str = "") -> dict:
    paths: dict = {}
    schemas: dict = {"Error": ERROR_SCHEMA}
    schemes: dict = {"apiKey": {"type": "http", "scheme": "bearer",
                                "description": "An API key: 'Authorization: Bearer <key>'."}}
    for table in tables:
        for (method, path), endpoint in table.items():
            template, names = _path_template(path)
            paths.setdefault(template, {})[method.lower()] = _operation(method, path, endpoint, names)
            if endpoint.error_shape is not None:
                schemas[endpoint.error_shape.name] = endpoint.error_shape.schema
            if endpoint.credential_header:
                name = endpoint.credential_header.decode()
                schemes[name] = {"type": "apiKey", "in": "header", "name": name,
                                 "description": "The same API key, as the bare key."}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description},
        "security": [{"apiKey": []}],
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": schemas, "securitySchemes": schemes},
    }


def routes(title: str, tables: list[dict], *, group: str | None, version: str,
           description: str = "") -> dict:
    """The table serving GET /openapi.json: the document of `tables` and of itself."""
    tables = list(tables)
    encoded: list[bytes] = []

    def openapi(ctx, request) -> Response:
        """This port's OpenAPI 3.1 document."""
        if not encoded:                 # the tables never change: build the bytes once
            encoded.append(orjson.dumps(document(title, [*tables, table], version=version,
                                                 description=description)))
        return Response(200, encoded[0], JSON)

    table = {("GET", PATH): Endpoint(openapi, None, group, responses={
        200: json_answer({"type": "object", "required": ["openapi", "info", "paths"]},
                         "The OpenAPI document of this port.")})}
    return table
