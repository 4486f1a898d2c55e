"""Fuzz: manifests and registry answers -> the OCI client (server/store/oci/).

Properties:
- a manifest, a model name, a challenge header are parsed or refused with PullError, never
  another exception; what is accepted is what the rules say (digests match DIGEST_RE whole);
- a whole pull against a registry that answers anything (statuses, redirects, challenges,
  lengths, ranges, bodies, from a script hypothesis writes) ends in success or PullError;
  the blobs folder then holds only verified `sha256-<hex>` blobs (and `.partial` files), and
  credentials were only ever sent to the registry's own origin.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import shutil
import tempfile

import httpx2
import pytest
from hypothesis import strategies as st

from stackd.store import oci
from stackd.store.oci import PullError, Puller, RegistryClient

from .budget import fuzz

pytestmark = pytest.mark.fuzz

BLOB = b"GGUF" + bytes(range(200))
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()
OTHER = "sha256:" + "ab" * 32
DIGESTS = st.sampled_from([DIGEST, OTHER, DIGEST + "\n", "sha256:" + "A" * 64, "sha256:../x", "", "sha512:00",
                           DIGEST.upper(), "sha256:" + "0" * 63])
MEDIA = st.sampled_from([oci.MEDIA_MODEL, "application/vnd.ollama.image.template", "", "x" * 300])
SIZES = st.one_of(st.sampled_from([len(BLOB), 0, -1, 1 << 62, len(BLOB) + 1]), st.booleans(), st.floats(),
                  st.text(max_size=3))


def json_values():
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), 1 << 63),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                        max_leaves=12)


descriptor = st.fixed_dictionaries({}, optional={"mediaType": MEDIA, "digest": DIGESTS, "size": SIZES,
                                                 "extra": json_values()})
manifest_doc = st.fixed_dictionaries({}, optional={
    "schemaVersion": st.sampled_from([2, 2, 1, "2", 2.0, True]),
    "mediaType": st.sampled_from([oci.MANIFEST_DOCKER_V2, oci.MANIFEST_OCI_V1, "application/json", None]),
    "config": st.one_of(st.none(), descriptor), "layers": st.one_of(st.lists(descriptor, max_size=4), json_values())})
manifest_bytes = st.one_of(manifest_doc.map(lambda d: json.dumps(d).encode()), st.binary(max_size=64),
                           json_values().map(lambda v: json.dumps(v).encode()))


def parse_manifest_or_refuse(raw: bytes) -> None:
    try:
        manifest = oci.parse_manifest(raw)
    except PullError:
        return
    for layer in (*manifest.layers, *((manifest.config,) if manifest.config else ())):
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", layer.digest), layer.digest
        assert type(layer.size) is int and layer.size >= 0


def test_manifests_are_parsed_or_refused(fuzz_seconds):
    fuzz(manifest_bytes, parse_manifest_or_refuse, seconds=fuzz_seconds / 3, batch=200)
    fuzz(st.text(max_size=80), parse_reference_or_refuse, seconds=fuzz_seconds / 3, batch=200)
    fuzz(st.text(max_size=120), lambda h: check_challenge(oci.parse_challenge(h)), seconds=fuzz_seconds / 3,
         batch=200)


def parse_reference_or_refuse(text: str) -> None:
    try:
        ref = oci.parse_reference(text)
    except PullError as exc:
        assert exc.status == 400
        return
    assert "\n" not in str(ref) and ".." not in ref.path() and ref.path().count("/") == 1
    assert oci.parse_reference(str(ref)) == ref


def check_challenge(parsed) -> None:
    scheme, params = parsed
    assert isinstance(scheme, str) and all(isinstance(k, str) and isinstance(v, str) for k, v in params.items())


# ---------------------------------------------------------------- a whole pull, scripted answers

BASE = "http://registry.test:5000"
LOCATIONS = st.sampled_from(["/v2/library/tiny/blobs/" + DIGEST, "http://registry.test:5000/elsewhere",
                             "http://registry.test:5001/other-port", "https://registry.test:5000/other-scheme",
                             "http://cdn.test/blob", "file:///etc/passwd", "//cdn.test/x", "", "::", "http://[::1",
                             "ftp://registry.test/x"])
CHALLENGES = st.sampled_from([
    'Bearer realm="http://registry.test:5000/token",service="s",scope="repository:library/tiny:pull"',
    'Bearer realm="http://registry.test:5001/token"', 'Bearer realm="http://auth.test/token"',
    'Bearer realm="file:///token"', 'Bearer realm=""', "Basic realm=x", "Basic", "Digest x=1", "", "Bearer ",
    'Bearer realm="http://registry.test:5000/token\\"x'])
BODIES = st.one_of(st.sampled_from([BLOB, BLOB[:10], BLOB + b"!", b"", b'{"token":"t1"}', b'{"access_token":"t2"}',
                                    b'{"token":5}', b"[]"]), manifest_bytes, st.binary(max_size=32))
answer = st.fixed_dictionaries({
    "status": st.sampled_from([200, 200, 200, 206, 301, 302, 307, 308, 401, 404, 416, 500]),
    "body": BODIES}, optional={
    "Location": LOCATIONS, "WWW-Authenticate": CHALLENGES,
    "Content-Length": st.sampled_from(["0", "5", str(len(BLOB)), "-1", "x", "99999999999"]),
    "Content-Range": st.sampled_from([f"bytes 0-{len(BLOB) - 1}/{len(BLOB)}", "bytes 5-9/*", "bytes x", ""]),
    "Docker-Content-Digest": DIGESTS})
GOOD_MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": oci.MANIFEST_DOCKER_V2, "layers": [
    {"mediaType": oci.MEDIA_MODEL, "digest": DIGEST, "size": len(BLOB)}]}).encode()
GOOD = {"manifests": GOOD_MANIFEST, "blobs": BLOB, "token": b'{"token":"t1"}'}
# per kind of request (manifest, blob, token): the answers to give, in order, before good ones
script = st.tuples(st.fixed_dictionaries({kind: st.lists(answer, max_size=4) for kind in GOOD}),
                   st.booleans(), st.booleans())


class Registry:
    """Answers each kind of request from its script in order; afterwards, as a good registry."""

    def __init__(self, answers: dict[str, list[dict]]):
        self.answers = {kind: list(a) for kind, a in answers.items()}
        self.seen: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append(request)
        path = request.url.path
        kind = "manifests" if "/manifests/" in path else "blobs" if "/blobs/" in path else "token"
        if self.answers[kind]:
            a = dict(self.answers[kind].pop(0))
            status, body = a.pop("status"), a.pop("body")
            return answer_with(status, a, body)
        if kind == "blobs" and not path.endswith("/" + DIGEST):
            return answer_with(404, {}, b"")
        return answer_with(200, {}, GOOD[kind])


def answer_with(status: int, headers: dict, body: bytes) -> httpx2.Response:
    """A response still to be streamed, as from a socket (content= would be read already)."""
    headers = {"Content-Length": str(len(body)), **headers}
    return httpx2.Response(status, headers=headers, stream=httpx2.ByteStream(body))


def pull_against(drawn) -> None:
    answers, with_credentials, prefetched = drawn
    registry = Registry(answers)
    blobs = tempfile.mkdtemp(prefix="stackd-fuzz-")
    try:
        if prefetched:                         # a partial left by an earlier pull
            with open(os.path.join(blobs, f"sha256-{DIGEST[7:]}.partial"), "wb") as f:
                f.write(BLOB[:50])
        credentials = {"username": "alice", "password": "s3cret"} if with_credentials else {}
        puller = Puller(lambda: RegistryClient(BASE, transport=httpx2.MockTransport(registry), stall_timeout=5,
                                               **credentials), blobs, disk_reserve=0)

        async def main():
            return [event async for event in puller.pull(oci.parse_reference("tiny"))]
        try:
            asyncio.run(main())
        except PullError:
            pass
        for name in os.listdir(blobs):
            match = re.fullmatch(r"sha256-([0-9a-f]{64})(\.partial)?", name)
            assert match, name
            if not match.group(2):
                with open(os.path.join(blobs, name), "rb") as f:
                    assert hashlib.sha256(f.read()).hexdigest() == match.group(1)
        basic = "Basic " + base64.b64encode(b"alice:s3cret").decode()
        for request in registry.seen:
            auth = request.headers.get("authorization")
            if auth is not None:
                assert (request.url.scheme, request.url.host, request.url.port) == ("http", "registry.test", 5000), \
                    (auth == basic, str(request.url))
    finally:
        shutil.rmtree(blobs, ignore_errors=True)


def test_a_pull_against_any_registry_ends_cleanly(fuzz_seconds):
    fuzz(script, pull_against, seconds=fuzz_seconds, batch=100)
