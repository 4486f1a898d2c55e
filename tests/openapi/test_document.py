"""The OpenAPI document: valid 3.1, complete, and generated from the routes and validators."""
import jsonschema_rs
import orjson
import pytest
import schemathesis

from stackd import daemon as daemon_module
from stackd.api.cluster import routes as cluster_routes
from stackd.http import openapi, validate
from stackd.http.errors import ApiError
from stackd.api.inference import chat, params
from stackd.api.inference import routes as inference_routes
from stackd.api import models as model_routes

pytestmark = pytest.mark.slow

INFERENCE_TABLES = [inference_routes.ROUTES, model_routes.ROUTES]
CLUSTER_TABLES = [cluster_routes.ROUTES, model_routes.ROUTES]


def document_of(tables) -> dict:
    return openapi.document("test", tables, version="0")


def served_document(port: str) -> dict:
    """What GET /openapi.json answers on that port: the daemon's own apps, the real handler."""
    apps = daemon_module.build_apps(1 << 20, None, None, daemon_module.Contexts())
    app = dict(zip(("inference", "cluster"), apps))[port]
    route, _ = app.match("GET", "/openapi.json")
    return orjson.loads(route.handler(route.ctx, None).body)


def every_schema(node):
    """Every JSON Schema in the document (request bodies, responses, components)."""
    if isinstance(node, dict):
        if "schema" in node and isinstance(node["schema"], dict):
            yield node["schema"]
        for value in node.values():
            yield from every_schema(value)
    elif isinstance(node, list):
        for value in node:
            yield from every_schema(value)


@pytest.mark.parametrize("tables", [INFERENCE_TABLES, CLUSTER_TABLES], ids=["inference", "cluster"])
def test_the_document_is_valid_openapi_3_1(tables):
    doc = document_of(tables)
    assert doc["openapi"] == "3.1.0"
    schemathesis.openapi.from_dict(doc).validate()      # against the OpenAPI 3.1 meta-schema
    for schema in every_schema(doc):                     # each schema is valid JSON Schema 2020-12
        jsonschema_rs.meta.validate({**schema, "$schema": "https://json-schema.org/draft/2020-12/schema"})


def test_a_broken_document_is_caught():
    doc = document_of(INFERENCE_TABLES)
    doc["paths"]["/v1/models"]["get"]["responses"] = "none"
    with pytest.raises(Exception):
        schemathesis.openapi.from_dict(doc).validate()


@pytest.mark.parametrize("port, tables", [("inference", INFERENCE_TABLES), ("cluster", CLUSTER_TABLES)])
def test_every_route_of_every_table_is_in_the_port_s_document(port, tables):
    doc = served_document(port)
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    expected = {(method, path.replace(":id", "{id}")) for table in tables for method, path in table}
    assert documented == expected | {("GET", "/openapi.json")}


def test_each_port_describes_only_its_own_groups():
    inference, cluster = served_document("inference"), served_document("cluster")
    assert "/v1/chat/completions" in inference["paths"] and "/v1/health" not in inference["paths"]
    assert "/v1/health" in cluster["paths"] and "/v1/embeddings" not in cluster["paths"]
    assert "/v1/models/load" in inference["paths"] and "/v1/models/load" in cluster["paths"]


def test_the_document_needs_a_key_but_no_permission():
    """Readable with any valid key, rate-limited in the group of the port it describes."""
    inference, cluster = daemon_module.build_apps(1 << 20, None, None, daemon_module.Contexts())
    for app, group in ((inference, "inference"), (cluster, "cluster")):
        route, _ = app.match("GET", "/openapi.json")
        assert route is not None and route.permission is None and route.group == group


def operations(doc):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def test_errors_are_documented_where_they_can_happen():
    doc = document_of(INFERENCE_TABLES + [cluster_routes.ROUTES])
    for method, path, op in operations(doc):
        statuses = set(op["responses"])
        assert {"401", "429"} <= statuses, (method, path)
        assert "500" not in statuses and "default" not in statuses, (method, path)
        if method == "POST":
            assert {"400", "403", "413", "415"} <= statuses, (method, path)
        for status, answer in op["responses"].items():
            if status >= "400":
                [media] = answer["content"].values()
                shape = "AnthropicError" if path.startswith("/v1/messages") else "Error"
                assert media["schema"] == {"$ref": f"#/components/schemas/{shape}"}, (path, status)
    paths = doc["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
                 "/v1/messages", "/v1/messages/count_tokens"):
        assert {"404", "503", "507"} <= set(paths[path]["post"]["responses"]), path
    assert {"404", "507"} <= set(paths["/v1/models/load"]["post"]["responses"])


def test_the_error_schema_is_the_spec_s_shape():
    schema = document_of(CLUSTER_TABLES)["components"]["schemas"]["Error"]
    validator = jsonschema_rs.validator_for(schema)
    good = ApiError(validate.invalid("x", "f").kind, "no", param="f").body()
    assert validator.is_valid(good)
    assert not validator.is_valid({"error": {"code": 400, "message": "no"}})       # no type
    assert not validator.is_valid({"detail": "no"})


def chat_body_schema(doc):
    return doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]


def test_a_field_added_to_a_validator_appears_in_the_document(monkeypatch):
    before = chat_body_schema(document_of(INFERENCE_TABLES))
    assert "typical_p" not in before["properties"]
    monkeypatch.setattr(params, "CHAT", params.CHAT)     # restored (the same list) afterwards
    field = validate.Number("typical_p", lo=0.0, hi=1.0, default=1.0)
    params.CHAT.append(field)
    try:
        after = chat_body_schema(document_of(INFERENCE_TABLES))
        assert after["properties"]["typical_p"] == {"type": ["number", "null"], "minimum": 0.0,
                                                    "maximum": 1.0, "default": 1.0}
        with pytest.raises(ApiError) as err:             # and the same spec validates
            params.parse({"typical_p": 3}, n_vocab=100, chat=True)
        assert err.value.param == "typical_p" and "'typical_p'" in err.value.message
    finally:
        params.CHAT.remove(field)
    params.parse({"typical_p": 3}, n_vocab=100, chat=True)   # gone again: ignored as unknown


def test_a_changed_bound_changes_the_document_and_the_check(monkeypatch):
    monkeypatch.setattr(chat.MESSAGES, "max_items", 2)
    schema = chat_body_schema(document_of(INFERENCE_TABLES))
    assert schema["properties"]["messages"]["maxItems"] == 2
    with pytest.raises(ApiError) as err:
        chat.messages_of({"messages": [{"role": "user", "content": "hi"}] * 3})
    assert err.value.param == "messages"


def test_request_fields_are_described_from_the_specs():
    schema = chat_body_schema(document_of(INFERENCE_TABLES))
    assert schema["required"] == ["model", "messages"]
    props = schema["properties"]
    assert props["temperature"]["maximum"] == 2.0 and props["n"]["maximum"] == params.MAX_N
    stop_choices = props["stop"]["anyOf"][0]["anyOf"]          # [string, array], or null
    assert stop_choices[1]["maxItems"] == params.MAX_STOP
    assert stop_choices[0]["maxLength"] == params.MAX_STOP_LEN
    message = props["messages"]["items"]
    assert message["properties"]["role"]["enum"] == list(chat.ROLES)
    assert set(params.CHAT_FIELDS.specs) == {s for s in params.CHAT}
