"""Coverage-guided fuzzing with atheris (libFuzzer), for `make fuzz` only.

    python -m tests.fuzz.atheris_targets gguf|manifest|params|dialects SECONDS

Each target takes raw bytes, so libFuzzer's mutations reach what the hypothesis strategies
do not think of; the properties are the hypothesis targets' own (an uncaught exception or a
failed assert is a crash, reported with the input that caused it).
"""
from __future__ import annotations

import os
import sys
import tempfile

import atheris

import orjson

# only the project's own code is instrumented (llama_cpp, numpy, httpx... would take minutes)
with atheris.instrument_imports(include=["stackd"]):
    from stackd.api.errors import answer_of
    from tests.answers import ANSWERED
    from stackd.api.inference import params
    from stackd.store import oci
    from tests.fuzz.test_fuzz_dialects import read_count, read_messages, read_responses, translated_or_4xx
    from tests.fuzz.test_fuzz_gguf import described_or_refused
    from tests.fuzz.test_fuzz_registry import GOOD_MANIFEST, parse_manifest_or_refuse
    from tests.store.tiny import write_tiny

WORK = tempfile.mkdtemp(prefix="stackd-atheris-")
GGUF_PATH = os.path.join(WORK, "fuzz.gguf")


def gguf(data: bytes) -> None:
    described_or_refused(GGUF_PATH, data)


def manifest(data: bytes) -> None:
    parse_manifest_or_refuse(data)


def request(data: bytes) -> None:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    if not isinstance(body, dict):
        return
    for chat in (True, False):
        try:
            params.parse(body, n_vocab=49152, chat=chat)
        except ANSWERED as exc:
            exc = answer_of(exc)
            assert 400 <= exc.kind.status < 500, exc.message


def dialects(data: bytes) -> None:
    """A JSON body as /v1/responses, /v1/messages and count_tokens read it."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    if isinstance(body, dict):
        for translate in (read_responses, read_messages, read_count):
            translated_or_4xx((translate, body))


def seeds(target: str) -> list[bytes]:
    if target == "gguf":
        with open(write_tiny(os.path.join(WORK, "seed.gguf")), "rb") as f:
            return [f.read()]
    if target == "manifest":
        return [GOOD_MANIFEST, b"{}"]
    if target == "dialects":
        return [b'{"model": "m", "max_tokens": 8, "system": "s", "messages": [{"role": "user", "content": '
                b'[{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}], "tools": [{"name": "f", '
                b'"input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "f"}}',
                b'{"model": "m", "input": [{"role": "user", "content": "x"}, {"type": "function_call", '
                b'"call_id": "c", "name": "f", "arguments": "{}"}], "tools": [{"type": "function", "name": "f"}], '
                b'"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}']
    return [b'{"max_tokens": 5, "temperature": 0.5, "stop": ["x"], "logit_bias": {"1": 2}}',
            b'{"response_format": {"type": "json_schema", "json_schema": {"schema": '
            b'{"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}}}}']


TARGETS = {"gguf": gguf, "manifest": manifest, "params": request, "dialects": dialects}


def main(target: str, seconds: int) -> None:
    corpus = os.path.join(WORK, f"corpus-{target}")
    os.makedirs(corpus)
    for i, seed in enumerate(seeds(target)):
        with open(os.path.join(corpus, f"seed{i}"), "wb") as f:
            f.write(seed)
    crashes = os.path.join(os.getcwd(), "build", "fuzz")
    os.makedirs(crashes, exist_ok=True)
    argv = [sys.argv[0], corpus, f"-max_total_time={seconds}", "-max_len=65536", "-rss_limit_mb=4096",
            f"-artifact_prefix={os.path.join(crashes, f'crash-{target}-')}"]
    atheris.Setup(argv, TARGETS[target])
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
