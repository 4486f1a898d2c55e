"""server/store/oci/ against the real docker-registry and against a misbehaving one."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time

import httpx2
import pytest

from stackd.store import oci
from stackd.store.oci import Layer, PullError, Puller, RegistryClient, parse_reference

from .misbehaving import MisbehavingRegistry, digest_of
from testing.registry_server import MEDIA_MODEL, MEDIA_PARAMS, MEDIA_TEMPLATE, RegistryServer

pytestmark = pytest.mark.slow

GGUF = b"GGUF" + bytes(range(256)) * 24          # a few KB that start like a GGUF file
TEMPLATE = b"{{ if .System }}<|system|>{{ .System }}{{ end }}<|user|>{{ .Prompt }}<|assistant|>"
PARAMS = b'{"stop": ["<|user|>"], "temperature": 0.2}'


def run(coro):
    return asyncio.run(coro)


class CountingTransport(httpx2.AsyncBaseTransport):
    """Records every request into a shared log; can hold requests whose path contains
    `gated` until `gate` is set."""

    def __init__(self, log: list, gate: asyncio.Event | None = None, gated: str = ""):
        self.inner = httpx2.AsyncHTTPTransport()
        self.log, self.gate, self.gated = log, gate, gated

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.log.append((request.method, request.url.path, dict(request.headers)))
        if self.gate is not None and self.gated and self.gated in request.url.path:
            await self.gate.wait()
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def collect(puller: Puller, ref) -> list[dict]:
    return [event async for event in puller.pull(ref)]


def sha256_file(path) -> str:
    with open(path, "rb") as f:
        return "sha256:" + hashlib.sha256(f.read()).hexdigest()


def blob_path(blobs_dir, digest: str) -> str:
    return os.path.join(str(blobs_dir), "sha256-" + digest.split(":")[1])


def listing(path) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


# ------------------------------------------------------------------ references

@pytest.mark.parametrize("text", ["../x", "a/b/c", "UPPER", "name:", ":tag", "x" * 300, "host:0/name",
                                  "host:65536/name", "Host.com/x", "a..b.com/x", "-a.com/x", "h.com/a/b/c",
                                  "ns/h.com/x", "h.com/", "h.com//x", "h.com/../x", "a..b",
                                  "-a", "a-", "a/", "/a", "a:b:c", "a:../x", "a:.x", "a b", "", "x:" + "t" * 129,
                                  "a" * 65, "nam\u00e9", "a:tag\n"])
def test_bad_references_are_400(text):
    with pytest.raises(PullError) as e:
        parse_reference(text)
    assert e.value.status == 400


@pytest.mark.parametrize("text,expected", [
    ("smollm2", ("library", "smollm2", "latest")),
    ("smollm2:135m", ("library", "smollm2", "135m")),
    ("jmorgan/qwen2.5-coder:7B_q4.k-m", ("jmorgan", "qwen2.5-coder", "7B_q4.k-m")),
    ("a" * 64 + ":" + "T" * 128, ("library", "a" * 64, "T" * 128)),
])
def test_good_references(text, expected):
    ref = parse_reference(text)
    assert (ref.namespace, ref.name, ref.tag, ref.host) == (*expected, "")
    assert ref.path() == f"{expected[0]}/{expected[1]}"
    assert str(ref) == f"{expected[0]}/{expected[1]}:{expected[2]}"


@pytest.mark.parametrize("text,expected", [
    ("registry.ollama.ai/library/qwen2.5:0.5b", ("registry.ollama.ai", "library", "qwen2.5", "0.5b")),
    ("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
     ("hf.co", "bartowski", "smollm2-135m-instruct-gguf", "Q4_K_M")),     # the tag keeps its case
    ("localhost:5000/x", ("localhost:5000", "library", "x", "latest")),
    ("127.0.0.1:65535/ns/m:t", ("127.0.0.1:65535", "ns", "m", "t")),
    ("example.com/x", ("example.com", "library", "x", "latest")),
])
def test_references_with_a_registry_host(text, expected):
    ref = parse_reference(text)
    assert (ref.host, ref.namespace, ref.name, ref.tag) == expected
    assert str(ref) == f"{expected[0]}/{expected[1]}/{expected[2]}:{expected[3]}"


def test_reference_constructed_directly_is_validated():
    assert str(oci.Reference(name="smollm2")) == "library/smollm2:latest"
    with pytest.raises(PullError) as e:
        oci.Reference("library", "../etc", "latest")
    assert e.value.status == 400


# ------------------------------------------------------------------ the real docker-registry

@pytest.fixture(scope="module")
def registry():
    with RegistryServer() as reg:
        pushed = reg.push_model("library/tiny", "latest",
                                [(MEDIA_MODEL, GGUF), (MEDIA_TEMPLATE, TEMPLATE), (MEDIA_PARAMS, PARAMS)])
        reg.push_model("library/tiny", "v2", [(MEDIA_MODEL, GGUF + b"v2"), (MEDIA_TEMPLATE, TEMPLATE)])
        reg.pushed = pushed
        yield reg


def test_registry_serves_ollama_media_types_as_pushed(registry):
    async def main():
        client = RegistryClient(registry.url)
        try:
            return await client.manifest(parse_reference("tiny"))
        finally:
            await client.aclose()
    manifest = run(main())
    assert manifest.raw == registry.pushed["manifest"]
    assert [(l.media_type, l.digest, l.size) for l in manifest.layers] == registry.pushed["layers"]
    assert manifest.config.digest == registry.pushed["config"][0]
    assert manifest.model_layer.digest == digest_of(GGUF)


def test_pull_from_real_registry_then_reuse(registry, tmp_path):
    blobs = tmp_path / "blobs"
    log: list = []
    puller = Puller(lambda: RegistryClient(registry.url, transport=CountingTransport(log)), str(blobs), disk_reserve=0)
    events = run(collect(puller, parse_reference("library/tiny:latest")))

    assert events[0] == {"status": "pulling manifest"}
    assert [e["status"] for e in events[-3:]] == ["verifying sha256 digest", "writing manifest", "success"]
    manifest = events[-1]["manifest"]
    assert manifest.raw == registry.pushed["manifest"]
    expected = {digest_of(d): d for d in (GGUF, TEMPLATE, PARAMS)}
    expected[registry.pushed["config"][0]] = None
    layer_events = events[1:-3]
    for e in layer_events:
        assert set(e) == {"status", "digest", "total", "completed"}
        assert e["status"] == "pulling " + e["digest"][7:19]
        assert 0 <= e["completed"] <= e["total"]
    finals = {}
    for e in layer_events:
        finals[e["digest"]] = e
    assert set(finals) == set(expected)
    assert all(e["completed"] == e["total"] for e in finals.values())
    assert finals[digest_of(GGUF)]["total"] == len(GGUF)

    assert listing(blobs) == sorted("sha256-" + d[7:] for d in expected)
    for digest, data in expected.items():
        assert sha256_file(blob_path(blobs, digest)) == digest
        if data is not None:
            assert open(blob_path(blobs, digest), "rb").read() == data
    blob_gets = [r for r in log if "/blobs/" in r[1]]
    assert len(blob_gets) == 4

    # a second pull downloads nothing again
    log.clear()
    again = run(collect(puller, parse_reference("tiny")))
    assert again[-1]["status"] == "success"
    assert [r for r in log if "/blobs/" in r[1]] == []
    assert len([r for r in log if "/manifests/" in r[1]]) == 1


def test_concurrent_pulls_share_one_download(registry, tmp_path):
    model_digest = digest_of(GGUF)
    log: list = []

    async def main():
        gate = asyncio.Event()     # holds the GGUF download until both pulls are waiting on it
        puller = Puller(lambda: RegistryClient(registry.url, transport=CountingTransport(
            log, gate, "/blobs/" + model_digest)), str(tmp_path / "blobs"), disk_reserve=0)
        at_model_layer = set()

        async def consume(which):
            events = []
            async for event in puller.pull(parse_reference("tiny")):
                events.append(event)
                if event.get("digest") == model_digest:
                    at_model_layer.add(which)
                    if len(at_model_layer) == 2:
                        gate.set()
            return events
        return await asyncio.gather(consume(1), consume(2))

    first_events, second_events = run(main())
    for events in (first_events, second_events):
        assert events[-1]["status"] == "success"
        final = [e for e in events if e.get("digest") == model_digest][-1]
        assert final["completed"] == final["total"] == len(GGUF)
    assert len([r for r in log if r[1].endswith("/blobs/" + model_digest)]) == 1
    assert sha256_file(blob_path(tmp_path / "blobs", model_digest)) == model_digest


def test_unknown_model_and_tag_are_404(registry, tmp_path):
    puller = Puller(lambda: RegistryClient(registry.url), str(tmp_path / "blobs"))
    for name in ("nosuchmodel", "tiny:nosuchtag", "someone/tiny"):
        with pytest.raises(PullError) as e:
            run(collect(puller, parse_reference(name)))
        assert e.value.status == 404, name
        assert "not found" in e.value.message
    assert listing(tmp_path / "blobs") == []


# ------------------------------------------------------------------ the misbehaving registry

@pytest.fixture
def bad():
    with MisbehavingRegistry("127.0.0.1") as server:
        yield server


@pytest.fixture
def other_host():
    with MisbehavingRegistry("127.0.0.2") as server:
        yield server


def pull_from(server, blobs_dir, name="tiny", **client_kwargs) -> list[dict]:
    client_kwargs.setdefault("stall_timeout", 5.0)
    puller = Puller(lambda: RegistryClient(server.url, **client_kwargs), str(blobs_dir), disk_reserve=0)
    return run(collect(puller, parse_reference(name)))


def fetch(server, layer, blobs_dir, ref="tiny", disk_reserve=0, **client_kwargs) -> str:
    async def main():
        client = RegistryClient(server.url, **client_kwargs)
        try:
            return await client.fetch_blob(parse_reference(ref), layer, str(blobs_dir), disk_reserve=disk_reserve)
        finally:
            await client.aclose()
    return run(main())


def model_layer(data: bytes = GGUF) -> Layer:
    return Layer(MEDIA_MODEL, digest_of(data), len(data))


def test_misbehaving_server_serves_a_good_pull(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF), (MEDIA_PARAMS, PARAMS)])
    events = pull_from(bad, tmp_path / "b")
    assert events[-1]["status"] == "success"
    assert sha256_file(blob_path(tmp_path / "b", digest_of(GGUF))) == digest_of(GGUF)


@pytest.mark.parametrize("mode", ["truncate", "bad_length", "long", "wrong_content"])
def test_broken_bodies_delete_the_partial_and_leave_the_store(bad, tmp_path, mode):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    bad.blob_modes[digest_of(GGUF)] = mode
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b")
    assert e.value.status == 502
    assert digest_of(GGUF) in e.value.message
    assert not any(name.startswith("sha256-" + digest_of(GGUF)[7:]) for name in listing(tmp_path / "b"))
    assert not any(name.endswith(".partial") for name in listing(tmp_path / "b"))


@pytest.mark.parametrize("digest", ["sha256:../x", "sha256:../../../../tmp/evil", "sha512:" + "a" * 128,
                                    "sha256:" + "A" * 64, "sha256:" + "a" * 63, "sha256:" + "a" * 65,
                                    "sha256:" + "a" * 63 + "/", "md5:" + "a" * 32, "", None, 7])
def test_bad_digests_create_nothing(bad, tmp_path, digest):
    body = ('{"schemaVersion":2,"mediaType":"%s","config":null,"layers":[{"mediaType":"%s","digest":%s,"size":4}]}'
            % ("application/vnd.docker.distribution.manifest.v2+json", MEDIA_MODEL,
               "null" if digest is None else (str(digest) if isinstance(digest, int) else f'"{digest}"'))).encode()
    bad.manifests["library/tiny:latest"] = body
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b")
    assert e.value.status == 502
    assert not os.path.exists(tmp_path / "b")
    assert bad.seen("/blobs/") == []
    # handed straight to fetch_blob, a bad digest is the caller's error
    if isinstance(digest, str):
        with pytest.raises(PullError) as e:
            fetch(bad, Layer(MEDIA_MODEL, digest, 4), tmp_path / "c")
        assert e.value.status == 400
        assert not os.path.exists(tmp_path / "c")
    assert listing(tmp_path) == []
    assert not os.path.exists("/tmp/evil")


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b'{"schemaVersion":1,"layers":[]}', b'{"schemaVersion":"2","layers":[]}',
    b'{"schemaVersion":2,"layers":[]}', b'{"schemaVersion":2,"layers":{}}',
    b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}',
    ('{"schemaVersion":2,"layers":[{"mediaType":"%s","digest":"%s","size":-1}]}' % (MEDIA_MODEL, digest_of(b"x"))).encode(),
    ('{"schemaVersion":2,"layers":[{"mediaType":"%s","digest":"%s","size":true}]}' % (MEDIA_MODEL, digest_of(b"x"))).encode(),
    ('{"schemaVersion":2,"layers":[{"mediaType":"%s","digest":"%s","size":1.5}]}' % (MEDIA_MODEL, digest_of(b"x"))).encode(),
    ('{"schemaVersion":2,"layers":[{"mediaType":"text/plain","digest":"%s","size":1}]}' % digest_of(b"x")).encode(),
    b'{"schemaVersion":2,"layers":[], "pad":"' + b"x" * (5 << 20) + b'"}',
])
def test_invalid_manifests_are_refused(bad, tmp_path, body):
    bad.manifests["library/tiny:latest"] = body
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b")
    assert e.value.status == 502
    assert not os.path.exists(tmp_path / "b")


def test_two_model_layers_are_refused(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF), (MEDIA_MODEL, GGUF + b"2")])
    with pytest.raises(PullError, match="2 application/vnd.ollama.image.model layers"):
        pull_from(bad, tmp_path / "b")
    assert bad.seen("/blobs/") == []


def test_endless_body_is_cut_off_at_the_declared_size(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    bad.blob_modes[digest_of(GGUF)] = "endless"
    with pytest.raises(PullError, match="more than the"):
        pull_from(bad, tmp_path / "b")
    assert listing(tmp_path / "b") == []
    for _ in range(500):                           # the server notices the closed socket
        if digest_of(GGUF) in bad.sent:
            break
        time.sleep(0.01)
    assert bad.sent.get(digest_of(GGUF), 0) < (256 << 20)


def test_redirect_to_file_is_refused(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    bad.blob_modes[digest_of(GGUF)] = ("redirect", "file:///etc/passwd")
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b")
    assert e.value.status == 502
    assert "refusing redirect" in e.value.message
    assert listing(tmp_path / "b") == []


def test_redirect_loop_is_bounded(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    path = "/v2/library/tiny/blobs/" + digest_of(GGUF)
    bad.blob_modes[digest_of(GGUF)] = ("redirect", bad.url + path)
    with pytest.raises(PullError, match="too many redirects"):
        pull_from(bad, tmp_path / "b")
    assert len(bad.seen("/blobs/")) == 6


def test_redirect_to_another_host_drops_authorization(bad, other_host, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    bad.require_bearer(bad.url + "/token")
    other_host.extra_paths["/cdn/blob"] = GGUF
    bad.blob_modes[digest_of(GGUF)] = ("redirect", other_host.url + "/cdn/blob")
    events = pull_from(bad, tmp_path / "b")
    assert events[-1]["status"] == "success"
    assert sha256_file(blob_path(tmp_path / "b", digest_of(GGUF))) == digest_of(GGUF)
    to_registry = [r for r in bad.seen("/blobs/" + digest_of(GGUF)) if "authorization" in r[2]]
    assert to_registry and to_registry[0][2]["authorization"] == "Bearer tok-123"
    arrived = other_host.seen("/cdn/blob")
    assert len(arrived) == 1
    assert "authorization" not in arrived[0][2]


def test_authorization_stays_dropped_when_a_redirect_comes_back(bad, other_host, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    bad.require_bearer(bad.url + "/token")
    bad.blob_modes[digest_of(GGUF)] = ("redirect", other_host.url + "/bounce")
    other_host.redirects["/bounce"] = bad.url + "/back/blob"
    bad.extra_paths["/back/blob"] = GGUF
    events = pull_from(bad, tmp_path / "b")
    assert events[-1]["status"] == "success"
    back = bad.seen("/back/blob")
    assert len(back) == 1 and "authorization" not in back[0][2]
    assert "authorization" not in other_host.seen("/bounce")[0][2]


def test_bearer_challenge_with_credentials_on_the_same_host(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    bad.require_bearer(bad.url + "/token")
    bad.token_basic = ("alice", "s3cret")
    bad.token_key = "access_token"

    async def main():
        client = RegistryClient(bad.url, username="alice", password="s3cret")
        try:
            ref = parse_reference("tiny")
            manifest = await client.manifest(ref)
            return await client.fetch_blob(ref, manifest.model_layer, str(tmp_path / "b"), disk_reserve=0)
        finally:
            await client.aclose()
    path = run(main())
    assert sha256_file(path) == digest_of(GGUF)
    tokens = bad.seen("/token")
    assert len(tokens) == 1                              # cached per scope: one token for manifest + blob
    assert "scope=repository%3Alibrary%2Ftiny%3Apull" in tokens[0][1]
    assert "service=test-registry" in tokens[0][1]
    assert tokens[0][2]["authorization"].startswith("Basic ")


def test_wrong_credentials_fail_cleanly(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    bad.require_bearer(bad.url + "/token")
    bad.token_basic = ("alice", "s3cret")
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b", username="alice", password="wrong")
    assert e.value.status == 502
    assert "token endpoint answered 401" in e.value.message


def test_credentials_never_go_to_a_foreign_realm(bad, other_host, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    bad.require_bearer(other_host.url + "/token", token="tok-foreign")
    events = pull_from(bad, tmp_path / "b", username="alice", password="s3cret")
    assert events[-1]["status"] == "success"
    token_requests = other_host.seen("/token")
    assert token_requests
    assert all("authorization" not in r[2] for r in token_requests)
    assert all("authorization" not in r[2] or r[2]["authorization"] == "Bearer tok-foreign"
               for r in bad.requests)


def test_stall_keeps_the_partial_then_a_pull_resumes_with_range(bad, tmp_path):
    data = GGUF * 8
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, data)])
    digest = digest_of(data)
    bad.blob_modes[digest] = "stall"
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b", stall_timeout=0.5)
    assert e.value.status == 504
    partial = blob_path(tmp_path / "b", digest) + ".partial"
    assert os.path.exists(partial)
    kept = os.path.getsize(partial)
    assert 0 < kept < len(data)
    assert open(partial, "rb").read() == data[:kept]
    assert not os.path.exists(blob_path(tmp_path / "b", digest))

    bad.blob_modes[digest] = "ok"
    events = pull_from(bad, tmp_path / "b")
    assert events[-1]["status"] == "success"
    assert sha256_file(blob_path(tmp_path / "b", digest)) == digest
    assert not os.path.exists(partial)
    ranges = [r[2].get("range") for r in bad.seen("/blobs/" + digest)]
    assert ranges[-1] == f"bytes={kept}-"


def test_stall_before_the_headers_is_504_and_keeps_a_partial(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    digest = digest_of(GGUF)
    bad.blob_modes[digest] = "stall_headers"
    os.makedirs(tmp_path / "b")
    partial = blob_path(tmp_path / "b", digest) + ".partial"
    with open(partial, "wb") as f:
        f.write(GGUF[:100])
    with pytest.raises(PullError) as e:
        fetch(bad, model_layer(), tmp_path / "b", stall_timeout=0.5)
    assert e.value.status == 504
    assert open(partial, "rb").read() == GGUF[:100]


def with_partial(registry, tmp_path, partial: bytes, mode: str = "ok") -> str:
    """The tiny model on `registry` (its blob served in `mode`), and a .partial of it holding
    `partial` in the store at tmp_path/b, as a killed daemon leaves one. -> the blob's digest."""
    registry.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    digest = digest_of(GGUF)
    registry.blob_modes[digest] = mode
    os.makedirs(tmp_path / "b")
    with open(blob_path(tmp_path / "b", digest) + ".partial", "wb") as f:
        f.write(partial)
    return digest


def test_resume_from_a_partial_left_by_a_killed_daemon(bad, tmp_path):
    digest = with_partial(bad, tmp_path, GGUF[:1000])
    fetch(bad, model_layer(), tmp_path / "b")
    assert sha256_file(blob_path(tmp_path / "b", digest)) == digest
    assert [r[2].get("range") for r in bad.seen("/blobs/")] == ["bytes=1000-"]


def test_server_ignoring_range_starts_over(bad, tmp_path):
    # wrong bytes in the partial: a resume would fail the digest
    digest = with_partial(bad, tmp_path, b"garbage!" * 100, "ignore_range")
    fetch(bad, model_layer(), tmp_path / "b")
    assert sha256_file(blob_path(tmp_path / "b", digest)) == digest
    assert [r[2].get("range") for r in bad.seen("/blobs/")] == ["bytes=800-"]


def test_wrong_content_range_is_refused(bad, tmp_path):
    with_partial(bad, tmp_path, GGUF[:1000], "bad_range")
    with pytest.raises(PullError, match="Content-Range"):
        fetch(bad, model_layer(), tmp_path / "b")
    assert listing(tmp_path / "b") == []


def test_partial_longer_than_declared_is_deleted(bad, tmp_path):
    digest = with_partial(bad, tmp_path, GGUF + b"extra")
    fetch(bad, model_layer(), tmp_path / "b")
    assert sha256_file(blob_path(tmp_path / "b", digest)) == digest
    assert [r[2].get("range") for r in bad.seen("/blobs/")] == [None]


def test_existing_blob_is_verified_and_reused_or_replaced(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    digest = digest_of(GGUF)
    os.makedirs(tmp_path / "b")
    final = blob_path(tmp_path / "b", digest)
    with open(final, "wb") as f:
        f.write(GGUF)
    assert fetch(bad, model_layer(), tmp_path / "b") == final
    assert bad.seen("/blobs/") == []
    with open(final, "r+b") as f:                   # corrupt it: same size, other bytes
        f.write(b"XXXX")
    fetch(bad, model_layer(), tmp_path / "b")
    assert len(bad.seen("/blobs/")) == 1
    assert sha256_file(final) == digest


def test_size_over_max_blob_bytes_is_413_before_any_byte(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b", max_blob_bytes=len(GGUF) - 1)
    assert e.value.status == 413
    assert bad.seen("/blobs/") == []
    assert listing(tmp_path / "b") == []
    with pytest.raises(PullError) as e:
        fetch(bad, model_layer(), tmp_path / "c", max_blob_bytes=100)
    assert e.value.status == 413
    assert listing(tmp_path / "c") == []


def test_size_over_free_disk_is_507(bad, tmp_path, monkeypatch):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    with pytest.raises(PullError) as e:
        fetch(bad, model_layer(), tmp_path / "b", disk_reserve=1 << 62)
    assert e.value.status == 507
    assert str(len(GGUF)) in e.value.message and "free" in e.value.message

    class Usage:
        total, used, free = 1 << 40, 1 << 40, 1000
    monkeypatch.setattr(oci.puller.shutil, "disk_usage", lambda path: Usage)
    puller = Puller(lambda: RegistryClient(bad.url), str(tmp_path / "c"), disk_reserve=0)
    with pytest.raises(PullError) as e:
        run(collect(puller, parse_reference("tiny")))
    assert e.value.status == 507
    assert bad.seen("/blobs/") == []
    assert listing(tmp_path / "b") == [] and listing(tmp_path / "c") == []


def test_missing_blob_is_502_and_creates_nothing(bad, tmp_path):
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    del bad.blobs[digest_of(GGUF)]
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b")
    assert e.value.status == 502
    assert listing(tmp_path / "b") == []


def test_progress_is_throttled(bad, tmp_path):
    data = b"GGUF" + os.urandom(4 << 20)
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, data)], config=None)
    chunks = []

    class Chunky(httpx2.AsyncBaseTransport):
        """Delivers the model blob in 4 KiB chunks, each on its own event-loop turn."""
        def __init__(self):
            self.inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request):
            response = await self.inner.handle_async_request(request)
            if "/blobs/" not in request.url.path:
                return response

            class Stream(httpx2.AsyncByteStream):
                async def __aiter__(self):
                    async for part in response.stream:
                        for i in range(0, len(part), 4096):
                            chunks.append(1)
                            await asyncio.sleep(0)
                            yield part[i:i + 4096]

                async def aclose(self):
                    await response.stream.aclose()
            return httpx2.Response(response.status_code, headers=response.headers, stream=Stream())

        async def aclose(self):
            await self.inner.aclose()

    puller = Puller(lambda: RegistryClient(bad.url, transport=Chunky()), str(tmp_path / "b"), disk_reserve=0)
    events = run(collect(puller, parse_reference("tiny")))
    layer_events = [e for e in events if e.get("digest") == digest_of(data)]
    assert len(chunks) >= 1000
    assert 2 <= len(layer_events) < len(chunks) // 10
    assert layer_events[-1]["completed"] == len(data)
    assert [e["completed"] for e in layer_events] == sorted(e["completed"] for e in layer_events)


def test_abandoned_pull_cancels_the_download_and_keeps_the_partial(bad, tmp_path):
    data = GGUF * 8
    bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, data)])
    bad.blob_modes[digest_of(data)] = "stall"

    async def main():
        puller = Puller(lambda: RegistryClient(bad.url, stall_timeout=60), str(tmp_path / "b"), disk_reserve=0)
        gen = puller.pull(parse_reference("tiny"))
        async for event in gen:
            if event.get("completed"):
                break
        task = puller._inflight[digest_of(data)].task
        await gen.aclose()
        await asyncio.wait([task], timeout=30)   # the shared task ends once nobody waits for it
        return task.cancelled(), dict(puller._inflight)
    assert run(main()) == (True, {})
    partial = blob_path(tmp_path / "b", digest_of(data)) + ".partial"
    assert 0 < os.path.getsize(partial) < len(data)


def test_manifest_digest_header_mismatch_is_refused(bad, tmp_path):
    body = bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
    orig = bad._send

    def send(h, status, payload, headers=None):
        if payload == body:
            headers = {**(headers or {}), "Docker-Content-Digest": digest_of(b"other")}
        orig(h, status, payload, headers)
    bad._send = send
    with pytest.raises(PullError, match="Docker-Content-Digest"):
        pull_from(bad, tmp_path / "b")


# ------------------------------------------------------------------ patterns match whole strings

NEWLINE_DIGEST = digest_of(GGUF) + "\n"        # re.match(r"...$") would accept it


def test_a_digest_with_a_trailing_newline_is_an_invalid_manifest(bad, tmp_path):
    bad.manifests["library/tiny:latest"] = json.dumps({
        "schemaVersion": 2, "mediaType": oci.MANIFEST_DOCKER_V2,
        "layers": [{"mediaType": MEDIA_MODEL, "digest": NEWLINE_DIGEST, "size": len(GGUF)}]}).encode()
    bad.blobs[NEWLINE_DIGEST] = GGUF
    with pytest.raises(PullError) as e:
        pull_from(bad, tmp_path / "b")
    assert e.value.status == 502 and "invalid digest" in e.value.message
    assert bad.seen("/blobs/") == [] and not os.path.exists(tmp_path / "b")
    with pytest.raises(PullError) as e:
        fetch(bad, Layer(MEDIA_MODEL, NEWLINE_DIGEST, len(GGUF)), tmp_path / "c")
    assert e.value.status == 400 and not os.path.exists(tmp_path / "c")


@pytest.mark.parametrize("namespace,name,tag", [("library", "tiny\n", "latest"), ("library\n", "tiny", "latest"),
                                                ("library", "tiny", "latest\n")])
def test_a_reference_with_a_trailing_newline_is_refused(namespace, name, tag):
    with pytest.raises(PullError) as e:
        oci.Reference(namespace, name, tag)
    assert e.value.status == 400


# ------------------------------------------------------------------ credentials: one exact origin

def test_credentials_never_go_to_another_port_of_the_same_host(bad, tmp_path):
    with MisbehavingRegistry("127.0.0.1") as token_server:      # same host, another port
        assert token_server.port != bad.port
        bad.add_model("library/tiny", "latest", [(MEDIA_MODEL, GGUF)])
        bad.require_bearer(token_server.url + "/token", token="tok-foreign")
        events = pull_from(bad, tmp_path / "b", username="alice", password="s3cret")
        assert events[-1]["status"] == "success"
        token_requests = token_server.seen("/token")
        assert token_requests and all("authorization" not in r[2] for r in token_requests)
    assert all(r[2].get("authorization") in (None, "Bearer tok-foreign") for r in bad.requests)
