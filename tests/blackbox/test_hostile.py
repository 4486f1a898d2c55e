"""Hostile bodies against the real daemon and models: a field at a time replaced by values
of the wrong type, out of range, huge or strange. Every answer is 200 or a 4xx in the spec's
shape, never a 5xx, and the daemon keeps serving."""
import json

import pytest

from testing.daemon import Daemon

VALUES = [None, True, False, -1, 0, 1, 2, 17, 3.5, -2.5, 1e308, -(2 ** 70), 2 ** 70, "", "x",
          "\u202e\u0000\ufeff", "𝕏" * 2000, [], [1, 2], ["a"] * 5, {}, {"a": 1}, {"type": "json_schema"},
          {"1": 500}, {"99999999": 1}, [[1, 2]], [{"role": "user"}], {"include_usage": "yes"}]
BODIES = {
    "/v1/chat/completions": {"model": "smollm2-135m-instruct", "max_tokens": 2,
                             "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "smollm2-135m-instruct", "prompt": "hi", "max_tokens": 2},
    "/v1/embeddings": {"model": "all-minilm-l6-v2", "input": "hi"},
}
FIELDS = {
    "/v1/chat/completions": ["model", "messages", "temperature", "top_p", "top_k", "min_p", "max_tokens",
                             "max_completion_tokens", "n", "stop", "seed", "logit_bias", "logprobs",
                             "top_logprobs", "response_format", "stream_options", "presence_penalty",
                             "frequency_penalty", "repeat_penalty", "min_tokens", "ignore_eos", "user"],
    "/v1/completions": ["model", "prompt", "echo", "logprobs", "stop", "n", "temperature", "max_tokens"],
    "/v1/embeddings": ["model", "input", "encoding_format", "dimensions", "user"],
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("hostile") / "data"),
                    "[rate_limits]\ninference = 0\n[engine]\nslots = 4\ncontext_length = 512\n",
                    models=True)
    yield daemon
    daemon.stop()


@pytest.mark.parametrize("path", list(BODIES))
def test_hostile_fields_get_4xx_never_5xx(daemon, path):
    statuses = set()
    for field in FIELDS[path]:
        for value in VALUES:
            body = json.dumps(dict(BODIES[path], **{field: value})).encode()   # big ints too
            status, _, reply = daemon.request("POST", path, port="inference", key=daemon.admin_key,
                                              body=body, headers={"Content-Type": "application/json"})
            assert status < 500, (field, value, status, reply)
            if status != 200:
                error = reply["error"]
                assert error["code"] == status and error["type"] and error["message"], reply
            statuses.add(status)
    assert 200 in statuses and 400 in statuses
    assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200
