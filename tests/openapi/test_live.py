"""GET /openapi.json on the live daemon: any valid key, each port its own routes."""
import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("port", ["inference", "cluster"])
def test_the_document_needs_a_valid_key(live, port):
    status, _, body = live.request("GET", "/openapi.json", port=port)
    assert status == 401 and body["error"]["type"] == "authentication_error"
    status, _, body = live.request("GET", "/openapi.json", port=port, key="sk-not-a-key")
    assert status == 401


def test_any_valid_key_reads_either_port_s_document(live):
    """A key with only the inference permission may not read the cluster's health, but it may
    read the cluster port's document."""
    status, _, _ = live.request("GET", "/v1/health", port="cluster", key=live.inference_key)
    assert status == 403
    status, headers, doc = live.request("GET", "/openapi.json", port="cluster", key=live.inference_key)
    assert status == 200 and headers["content-type"] == "application/json"
    assert "/v1/health" in doc["paths"] and "/v1/chat/completions" not in doc["paths"]
    status, _, doc = live.request("GET", "/openapi.json", port="inference", key=live.inference_key)
    assert status == 200 and "/v1/chat/completions" in doc["paths"]
    assert doc["openapi"] == "3.1.0"
