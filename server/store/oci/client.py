"""The registry client: the OCI distribution API as Ollama's registry serves it, and the
manifests it answers.

A model is a manifest (docker schema 2 or OCI image manifest) whose layers are
content-addressed blobs: the GGUF weights (MEDIA_MODEL), a chat template, parameters...
`RegistryClient` speaks the registry API (manifests, blobs, bearer-token challenges,
redirects); its blobs' downloads are puller.py's `BlobDownloads`, mixed in.

Safety rules kept here, not by callers:
- credentials (basic auth and bearer tokens) go to the registry's own origin only (scheme,
  host and port: another port of the same host is another server);
- redirects are followed by hand: http/https only, at most 5, and the Authorization header
  is dropped as soon as a redirect leaves the registry's origin.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass

from ...system.imports import lazy_import
from .puller import BlobDownloads
from .reference import DIGEST_RE, PullError, Reference


MEDIA_MODEL = "application/vnd.ollama.image.model"   # the GGUF layer

MANIFEST_DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_OCI_V1 = "application/vnd.oci.image.manifest.v1+json"
# docker-registry (distribution 2.8) answers a manifest GET whose Accept lacks the docker v2
# type by converting to schema 1, which fails (400) for Ollama manifests: always send both.
MANIFEST_ACCEPT = f"{MANIFEST_DOCKER_V2}, {MANIFEST_OCI_V1}"

MAX_MANIFEST_BYTES = 4 << 20
MAX_TOKEN_BYTES = 1 << 20
MAX_LAYERS = 1024
MAX_REDIRECTS = 5

httpx = lazy_import("httpx2")  # loaded by the first pull, not by every daemon's start


def _read_large_pieces() -> None:
    """httpcore reads a response 64 KiB at a time through its pure-Python parser, which caps a
    blob download at about 0.7x curl on loopback; model blobs are gigabytes, so read 1 MiB."""
    import httpcore2._async.http11
    httpcore2._async.http11.AsyncHTTP11Connection.READ_NUM_BYTES = 1 << 20


# ---------------------------------------------------------------- manifests

@dataclass(frozen=True)
class Layer:
    media_type: str
    digest: str
    size: int

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]


@dataclass(frozen=True)
class Manifest:
    config: Layer | None
    layers: tuple[Layer, ...]
    raw: bytes

    @property
    def model_layer(self) -> Layer:
        found = [layer for layer in self.layers if layer.media_type == MEDIA_MODEL]
        if not found:
            raise PullError(f"the manifest has no {MEDIA_MODEL} layer")
        if len(found) > 1:
            raise PullError(f"the manifest has {len(found)} {MEDIA_MODEL} layers, expected one")
        return found[0]

    def blobs(self) -> list[Layer]:
        """Every blob to fetch (layers, then config), each digest once."""
        out: list[Layer] = []
        seen: set[str] = set()
        for layer in (*self.layers, *((self.config,) if self.config else ())):
            if layer.digest not in seen:
                seen.add(layer.digest)
                out.append(layer)
        return out


def _parse_descriptor(obj: object, where: str) -> Layer:
    if not isinstance(obj, dict):
        raise PullError(f"invalid manifest: {where} is not an object")
    media, digest, size = obj.get("mediaType"), obj.get("digest"), obj.get("size")
    if not isinstance(media, str) or not media or len(media) > 255:
        raise PullError(f"invalid manifest: {where} has no valid mediaType")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise PullError(f"invalid manifest: {where} has an invalid digest {str(digest)[:80]!r} "
                        "(only sha256:<64 lowercase hex> is accepted)")
    if type(size) is not int or size < 0:
        raise PullError(f"invalid manifest: {where} has an invalid size")
    return Layer(media, digest, size)


def parse_manifest(raw: bytes) -> Manifest:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise PullError("invalid manifest: not JSON") from None
    if not isinstance(doc, dict):
        raise PullError("invalid manifest: not a JSON object")
    if type(doc.get("schemaVersion")) is not int or doc["schemaVersion"] != 2:
        raise PullError("invalid manifest: schemaVersion must be 2")
    media = doc.get("mediaType")
    if media is not None and media not in (MANIFEST_DOCKER_V2, MANIFEST_OCI_V1):
        raise PullError(f"unsupported manifest type {str(media)[:100]!r}")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise PullError("invalid manifest: layers must be a non-empty list")
    if len(layers) > MAX_LAYERS:
        raise PullError("invalid manifest: too many layers")
    parsed = tuple(_parse_descriptor(layer, f"layer {i}") for i, layer in enumerate(layers))
    config = doc.get("config")
    return Manifest(None if config is None else _parse_descriptor(config, "config"), parsed, bytes(raw))


# ---------------------------------------------------------------- registry client

def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    port = url.port or {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host.lower(), port


_CHALLENGE_PARAM_RE = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]*))\s*,?')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """'Bearer realm="...",service="...",scope="..."' -> ("bearer", {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        m = _CHALLENGE_PARAM_RE.match(rest, pos)
        if not m or m.end() == pos:
            break
        value = m.group(2) if m.group(2) is not None else m.group(3)
        params[m.group(1).lower()] = re.sub(r"\\(.)", r"\1", value)
        pos = m.end()
    return scheme.lower(), params


class RegistryClient(BlobDownloads):
    def __init__(self, base_url: str, *, username: str | None = None, password: str | None = None,
                 timeout: float = 30.0, stall_timeout: float = 30.0, max_blob_bytes: int = 64 << 30,
                 transport: httpx.AsyncBaseTransport | None = None):
        _read_large_pieces()
        self.base = httpx.URL(base_url.rstrip("/"))
        if self.base.scheme not in ("http", "https") or not self.base.host:
            raise ValueError(f"registry URL must be http(s)://host[:port], got {base_url!r}")
        self.username = username
        self.password = password
        self.timeout = timeout
        self.stall_timeout = stall_timeout
        self.max_blob_bytes = max_blob_bytes
        self._tokens: dict[str, str] = {}      # scope -> bearer token
        self._basic = False                     # the registry asked for basic auth
        self._client = httpx.AsyncClient(
            transport=transport, follow_redirects=False,
            timeout=httpx.Timeout(timeout),
            headers={"User-Agent": "stackd"})

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> "RegistryClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # ---- HTTP with auth and redirects

    def _url(self, ref: Reference, kind: str, what: str) -> httpx.URL:
        return self.base.copy_with(path=f"{self.base.path.rstrip('/')}/v2/{ref.path()}/{kind}/{what}")

    def _basic_header(self) -> str:
        userpass = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(userpass).decode("ascii")

    def _auth_header(self, scope: str) -> str | None:
        token = self._tokens.get(scope)
        if token:
            return f"Bearer {token}"
        if self._basic and self.username is not None:
            return self._basic_header()
        return None

    async def _send(self, method: str, url: httpx.URL, headers: dict[str, str],
                    auth: str | None, timeout: httpx.Timeout | None = None) -> httpx.Response:
        """Send one request and follow redirects by hand; returns an open streaming response."""
        origin = _origin(self.base)
        for _ in range(MAX_REDIRECTS + 1):
            h = dict(headers)
            if auth is not None and _origin(url) == origin:
                h["Authorization"] = auth
            try:
                request = self._client.build_request(method, url, headers=h,
                                                     timeout=timeout or self._client.timeout)
                response = await self._client.send(request, stream=True)
            except httpx.TimeoutException as e:
                raise PullError(f"registry timed out: {type(e).__name__}", 504) from None
            except httpx.HTTPError as e:
                raise PullError(f"cannot reach the registry: {type(e).__name__}: {e}") from None
            if response.status_code not in (301, 302, 303, 307, 308):
                return response
            location = response.headers.get("Location", "")
            await response.aclose()
            try:
                target = url.join(location)
            except (httpx.InvalidURL, ValueError):
                raise PullError("refusing redirect to an invalid URL") from None
            if target.scheme not in ("http", "https") or not target.host:
                raise PullError(f"refusing redirect to a {target.scheme or 'relative'}:// URL")
            if _origin(target) != origin:
                auth = None                     # never again in this chain, even if it comes back
            url = target
        raise PullError(f"too many redirects (more than {MAX_REDIRECTS})")

    async def _request(self, method: str, url: httpx.URL, scope: str, headers: dict[str, str],
                       timeout: httpx.Timeout | None = None) -> httpx.Response:
        """_send, answering one 401 challenge (bearer token or basic auth)."""
        response = await self._send(method, url, headers, self._auth_header(scope), timeout)
        if response.status_code != 401:
            return response
        challenge = response.headers.get("WWW-Authenticate", "")
        await response.aclose()
        kind, params = parse_challenge(challenge)
        if kind == "bearer" and params.get("realm"):
            self._tokens.pop(scope, None)
            self._tokens[scope] = await self._fetch_token(params, scope)
        elif kind == "basic" and self.username is not None and not self._basic:
            self._basic = True
        else:
            raise PullError("the registry requires authentication" if self.username is None
                            else "the registry refused the credentials")
        response = await self._send(method, url, headers, self._auth_header(scope), timeout)
        if response.status_code == 401:
            await response.aclose()
            self._tokens.pop(scope, None)
            raise PullError("the registry refused the token it issued" if kind == "bearer"
                            else "the registry refused the credentials")
        return response

    async def _fetch_token(self, params: dict[str, str], default_scope: str) -> str:
        try:
            realm = httpx.URL(params["realm"])
        except (httpx.InvalidURL, ValueError):
            raise PullError("invalid token realm in the registry's challenge") from None
        if realm.scheme not in ("http", "https") or not realm.host:
            raise PullError("the token realm must be an http(s) URL")
        query = {"scope": params.get("scope") or default_scope}
        if params.get("service"):
            query["service"] = params["service"]
        headers = {}
        if self.username is not None and _origin(realm) == _origin(self.base):   # scheme, host and port
            headers["Authorization"] = self._basic_header()
        try:
            async with self._client.stream("GET", realm.copy_merge_params(query), headers=headers) as r:
                body = await self._read_capped(r, MAX_TOKEN_BYTES, "token response")
        except httpx.TimeoutException:
            raise PullError("the token endpoint timed out", 504) from None
        except httpx.HTTPError as e:
            raise PullError(f"cannot reach the token endpoint: {type(e).__name__}") from None
        if r.status_code != 200:
            raise PullError(f"the token endpoint answered {r.status_code}")
        try:
            doc = json.loads(body)
        except ValueError:
            raise PullError("the token endpoint answered invalid JSON") from None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
            raise PullError("the token endpoint answered no token")
        return token

    async def _read_capped(self, response: httpx.Response, cap: int, what: str) -> bytes:
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise PullError(f"{what} too large ({declared} bytes, at most {cap})")
        buf = bytearray()
        try:
            async for chunk in response.aiter_bytes():
                buf += chunk
                if len(buf) > cap:
                    raise PullError(f"{what} too large (more than {cap} bytes)")
        except httpx.TimeoutException:
            raise PullError(f"{what} timed out", 504) from None
        except httpx.HTTPError as e:
            raise PullError(f"{what} broken: {type(e).__name__}") from None
        return bytes(buf)

    # ---- manifests

    async def manifest(self, ref: Reference) -> Manifest:
        url = self._url(ref, "manifests", ref.tag)
        response = await self._request("GET", url, ref.scope, {"Accept": MANIFEST_ACCEPT})
        try:
            if response.status_code == 404:
                raise PullError(f"model not found in the registry: {ref}", 404)
            if response.status_code != 200:
                raise PullError(f"the registry answered {response.status_code} for the manifest of {ref}")
            raw = await self._read_capped(response, MAX_MANIFEST_BYTES, "manifest")
        finally:
            await response.aclose()
        manifest = parse_manifest(raw)
        claimed = response.headers.get("Docker-Content-Digest", "")
        if DIGEST_RE.fullmatch(claimed) and claimed != "sha256:" + hashlib.sha256(raw).hexdigest():
            raise PullError("the manifest does not match its Docker-Content-Digest")
        return manifest
