"""Pulling models from an OCI distribution registry, the way Ollama's registry serves them.

A model is a manifest (docker schema 2 or OCI image manifest) whose layers are
content-addressed blobs: the GGUF weights (MEDIA_MODEL), a chat template, parameters...
`RegistryClient` speaks the registry API (manifests, blobs, bearer-token challenges,
redirects); `fetch_blob` streams one blob into `blobs_dir/sha256-<hex>.partial`, verifies
its size and sha256 and renames it into place. `Puller` runs a whole pull, shares in-flight
downloads of the same blob between concurrent pulls and reports Ollama-shaped progress.

Safety rules kept here, not by callers:
- every file name is derived from a digest that matched DIGEST_RE; nothing the server
  sends ever names a file;
- a blob is in its final place only after its size and sha256 were verified;
- credentials (basic auth and bearer tokens) go to the registry's own origin only (scheme,
  host and port: another port of the same host is another server);
- redirects are followed by hand: http/https only, at most 5, and the Authorization header
  is dropped as soon as a redirect leaves the registry's origin.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ..system.imports import lazy_import

# Every pattern here is used with fullmatch: match() with "$" also accepts a trailing "\n".
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
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
PROGRESS_INTERVAL = 0.1        # seconds between progress events of one layer
WRITE_BATCH = 1 << 20          # bytes buffered before one write+hash in a worker thread
MAX_BATCHES_IN_FLIGHT = 8      # batches queued to the writer thread before receiving waits

httpx = lazy_import("httpx2")  # loaded by the first pull, not by every daemon's start


def _read_large_pieces() -> None:
    """httpcore reads a response 64 KiB at a time through its pure-Python parser, which caps a
    blob download at about 0.7x curl on loopback; model blobs are gigabytes, so read 1 MiB."""
    import httpcore2._async.http11
    httpcore2._async.http11.AsyncHTTP11Connection.READ_NUM_BYTES = 1 << 20
HASH_CHUNK = 4 << 20


class PullError(Exception):
    """`status` is the HTTP status the API should answer: 400 bad name or bad digest,
    404 unknown model/tag, 409 same blob being downloaded by another client, 413 too large,
    507 no disk, 502 registry misbehaved, 504 stall/timeout."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.message = message
        self.status = status


# ---------------------------------------------------------------- references

_COMPONENT_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
MAX_REFERENCE = 200


_HOST_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
                      r"(?::[0-9]{1,5})?")


def _host_ok(host: str) -> bool:
    if not isinstance(host, str) or len(host) > 253 or not _HOST_RE.fullmatch(host):
        return False
    _, _, port = host.partition(":")
    return not port or 1 <= int(port) <= 65535


def looks_like_host(part: str) -> bool:
    """Ollama's rule: a first part with a dot or a port, or `localhost`, is a registry host."""
    return "." in part or ":" in part or part == "localhost"


@dataclass(frozen=True)
class Reference:
    namespace: str = "library"
    name: str = ""
    tag: str = "latest"
    host: str = ""                 # a registry named in the reference; "" is the configured one

    def __post_init__(self) -> None:
        # constructed directly (not through parse_reference): the same rules, so that
        # path() is always safe to put in a URL
        if not (_component_ok(self.namespace) and "." not in self.namespace
                and self.namespace != "localhost" and _component_ok(self.name)
                and isinstance(self.tag, str) and _TAG_RE.fullmatch(self.tag) and ".." not in self.tag
                and (self.host == "" or _host_ok(self.host))):
            raise PullError(f"invalid model reference {self.namespace!r}/{self.name!r}:{self.tag!r}", 400)

    def path(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.host + '/' if self.host else ''}{self.namespace}/{self.name}:{self.tag}"

    @property
    def scope(self) -> str:
        return f"repository:{self.path()}:pull"


def _component_ok(text: str) -> bool:
    return isinstance(text, str) and 1 <= len(text) <= 64 and ".." not in text and _COMPONENT_RE.fullmatch(text) is not None


def parse_reference(text: str) -> Reference:
    """"name", "name:tag", "ns/name:tag", each optionally after a registry host
    ("host[:port]/ns/name:tag", "host/name"); anything else is PullError(400). Whether a
    named host may be pulled from is the caller's decision (pulling.py)."""
    def bad(why: str) -> PullError:
        return PullError(f"invalid model name {text[:64]!r}: {why}", 400)

    if not isinstance(text, str) or not text:
        raise PullError("invalid model name: empty", 400)
    if len(text) > MAX_REFERENCE:
        raise bad(f"longer than {MAX_REFERENCE} characters")
    if not text.isascii() or not text.isprintable():
        raise bad("only ASCII letters, digits and . _ - / : are allowed")
    head, slash, last = text.rpartition("/")
    last, sep, tag = last.partition(":")
    if sep:
        if not _TAG_RE.fullmatch(tag) or ".." in tag:
            raise bad("the tag must be 1-128 of [A-Za-z0-9._-], not starting with . or -")
    else:
        tag = "latest"
    parts = (head.split("/") if slash else []) + [last]
    host = ""
    if len(parts) > 1 and looks_like_host(parts[0]):
        host = parts.pop(0)
        if not _host_ok(host):
            raise bad("the registry host must be a lower-case host name or address, with an optional port")
        # repository names on the wire are lower case (OCI distribution); Hugging Face's
        # repository names, written with capitals on its pages, are matched without case
        parts = [part.lower() for part in parts]
    if len(parts) > 2:
        raise bad("expected name, name:tag or namespace/name:tag, optionally after a registry host")
    for part in parts:
        if not _component_ok(part):
            raise bad("each part must be 1-64 of [a-z0-9] with single . _ - inside")
    if len(parts) == 2:
        namespace, name = parts
        if looks_like_host(namespace):
            raise bad("the registry host must come first")
    else:
        namespace, name = "library", parts[0]
    return Reference(namespace, name, tag, host)


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


def _hash_file(path: str, limit: int | None = None) -> tuple[hashlib._Hash, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while limit is None or n < limit:
            chunk = f.read(HASH_CHUNK if limit is None else min(HASH_CHUNK, limit - n))
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    return h, n


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# Blobs already verified in this process, by (path, dev, inode, size, mtime): an existing
# blob is hashed once, not at every pull that reuses it.
_VERIFIED: dict[str, tuple[int, int, int, int]] = {}


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class _Stall(Exception):
    pass


class RegistryClient:
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

    # ---- blobs

    async def fetch_blob(self, ref: Reference, layer: Layer, blobs_dir: str, *,
                         progress: Callable[[int, int], None] | None = None,
                         disk_reserve: int = 1 << 30) -> str:
        if not isinstance(layer.digest, str) or not DIGEST_RE.fullmatch(layer.digest):
            raise PullError(f"invalid digest {str(layer.digest)[:80]!r}", 400)
        if type(layer.size) is not int or layer.size < 0:
            raise PullError(f"invalid size for {layer.digest}", 400)
        size = layer.size
        if size > self.max_blob_bytes:
            raise PullError(f"blob {layer.digest} is {size} bytes, more than the limit of "
                            f"{self.max_blob_bytes} bytes", 413)
        hexd = layer.digest[len("sha256:"):]
        os.makedirs(blobs_dir, exist_ok=True)
        final = os.path.join(blobs_dir, f"sha256-{hexd}")
        partial = final + ".partial"
        report = progress or (lambda done, total: None)

        if await asyncio.to_thread(self._existing_ok, final, layer):
            report(size, size)
            return final

        have = 0
        with contextlib.suppress(FileNotFoundError):
            have = os.lstat(partial).st_size
        if have > size:
            os.unlink(partial)
            have = 0
        check_disk(blobs_dir, size - have, disk_reserve)

        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise PullError(f"cannot create {partial}: {e.strerror}", 507 if e.errno == errno.ENOSPC else 500) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PullError(f"blob {layer.digest} is being downloaded by another client", 409) from None
            try:
                await self._download(ref, layer, fd, partial, report)
            except BaseException:
                # a failure before any byte arrived leaves no empty .partial behind
                with contextlib.suppress(OSError):
                    if os.fstat(fd).st_size == 0:
                        os.unlink(partial)
                raise
            os.replace(partial, final)
        finally:
            os.close(fd)
        _fsync_dir(blobs_dir)
        with contextlib.suppress(OSError):
            _VERIFIED[final] = _stat_key(os.stat(final))
        return final

    @staticmethod
    def _existing_ok(final: str, layer: Layer) -> bool:
        try:
            st = os.stat(final)
        except FileNotFoundError:
            return False
        if _VERIFIED.get(final) == _stat_key(st) and st.st_size == layer.size:
            return True
        ok = st.st_size == layer.size and _hash_file(final)[0].hexdigest() == layer.hex
        if ok:
            _VERIFIED[final] = _stat_key(st)
        else:                                   # corrupt or foreign: replace it
            _VERIFIED.pop(final, None)
            os.unlink(final)
        return ok

    async def _download(self, ref: Reference, layer: Layer, fd: int, partial: str,
                        report: Callable[[int, int], None]) -> None:
        size = layer.size
        have = os.fstat(fd).st_size
        if have > size:
            os.ftruncate(fd, 0)
            have = 0
        hasher = hashlib.sha256()
        if have:
            hasher, have = await asyncio.to_thread(_hash_file, partial, have)

        def discard(message: str) -> PullError:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            return PullError(message)

        if have == size:                      # a complete partial: only verification is left
            report(have, size)
            if hasher.hexdigest() != layer.hex:
                # stale or corrupt bytes: start over once
                os.ftruncate(fd, 0)
                hasher, have = hashlib.sha256(), 0
            else:
                await _blocking(os.fsync, fd)
                return

        url = self._url(ref, "blobs", layer.digest)
        for attempt in range(2):
            headers = {"Accept-Encoding": "identity"}
            if have:
                headers["Range"] = f"bytes={have}-"
            # no byte for stall_timeout, headers included, is a stall
            response = await self._request("GET", url, ref.scope, headers,
                                           httpx.Timeout(self.timeout, read=self.stall_timeout))
            try:
                status = response.status_code
                if status == 404:
                    raise PullError(f"blob {layer.digest} of {ref} not found in the registry")
                if status == 416 and have and attempt == 0:
                    os.ftruncate(fd, 0)        # the server cannot resume: start over
                    hasher, have = hashlib.sha256(), 0
                    continue
                if status == 200:
                    if have:
                        os.ftruncate(fd, 0)    # the server ignored the Range: start over
                        hasher, have = hashlib.sha256(), 0
                elif status == 206 and have:
                    if not _content_range_ok(response.headers.get("Content-Range", ""), have, size):
                        raise discard(f"the registry answered a wrong Content-Range "
                                      f"{response.headers.get('Content-Range', '')[:80]!r} for bytes={have}-")
                else:
                    raise PullError(f"the registry answered {status} for blob {layer.digest}")
                declared = response.headers.get("Content-Length")
                if declared is not None and (not declared.isdigit() or int(declared) != size - have):
                    raise discard(f"the registry declared {declared[:40]} bytes for blob {layer.digest}, "
                                  f"expected {size - have}")
                os.lseek(fd, have, os.SEEK_SET)
                have = await self._stream(response, fd, hasher, have, size, layer, report, discard)
            finally:
                await response.aclose()
            break

        if have != size:
            raise discard(f"blob {layer.digest}: the registry sent {have} bytes, expected {size}")
        if hasher.hexdigest() != layer.hex:
            raise discard(f"blob {layer.digest}: sha256 mismatch (got sha256:{hasher.hexdigest()})")
        await _blocking(os.fsync, fd)

    async def _stream(self, response: httpx.Response, fd: int, hasher, have: int, size: int,
                      layer: Layer, report: Callable[[int, int], None], discard) -> int:
        """Append the body to fd; returns the byte count. A stall keeps what arrived."""
        buf = bytearray()
        writer = _BlobWriter(fd, hasher)

        def flush() -> None:
            if buf:
                data = bytes(buf)
                buf.clear()
                _write_all(fd, data)
                hasher.update(data)

        chunks = response.aiter_raw().__aiter__()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.stall_timeout):
                        chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise _Stall() from None
                if have + len(buf) + len(chunk) > size:
                    raise discard(f"blob {layer.digest}: the registry sent more than the {size} bytes declared")
                buf += chunk
                if len(buf) >= WRITE_BATCH:
                    data = bytes(buf)
                    buf.clear()
                    await writer.put(data)
                    have += len(data)
                report(have + len(buf), size)
            await writer.drain()
        except (_Stall, httpx.TimeoutException):
            flush_len = len(buf)
            await writer.drain()
            await _blocking(flush)
            await _blocking(os.fsync, fd)
            raise PullError(f"blob {layer.digest}: no data from the registry for {self.stall_timeout:g}s "
                            f"(kept {have + flush_len} of {size} bytes; pulling again resumes)", 504) from None
        except httpx.RemoteProtocolError:
            # the server closed before its Content-Length: a truncated body
            raise discard(f"blob {layer.digest}: the registry closed the connection after "
                          f"{have + len(buf)} of {size} bytes") from None
        except httpx.HTTPError as e:
            flush_len = len(buf)
            await writer.drain()
            await _blocking(flush)
            raise PullError(f"blob {layer.digest}: connection lost after {have + flush_len} bytes "
                            f"({type(e).__name__}); pulling again resumes") from None
        except asyncio.CancelledError:
            writer.close()                     # the caller closes fd next: finish writes first
            with contextlib.suppress(OSError, PullError):
                flush()                        # keep what arrived for a later resume
            raise
        finally:
            writer.close()
        n = len(buf)
        await _blocking(flush)
        return have + n


async def _blocking(fn, *args):
    """Run fn in a worker thread. If cancelled, wait for the thread anyway before
    re-raising: fn uses a file descriptor that the caller closes right after."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as e:
            raise PullError(f"cannot write the blob: {e.strerror}", 507 if e.errno == errno.ENOSPC else 500) from None
        view = view[n:]


class _BlobWriter:
    """Writes and hashes batches, in order, on one worker thread while the event loop keeps
    receiving: the network read never waits for sha256, which inline halves a pull."""

    def __init__(self, fd: int, hasher):
        self.fd, self.hasher = fd, hasher
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blob-writer")
        self._pending: collections.deque = collections.deque()

    async def put(self, data: bytes) -> None:
        self._pending.append(self._executor.submit(_write_and_hash, self.fd, self.hasher, data))
        if len(self._pending) > MAX_BATCHES_IN_FLIGHT:
            await asyncio.wrap_future(self._pending.popleft())

    async def drain(self) -> None:
        """Wait for every queued batch; a failed write raises here."""
        while self._pending:
            await asyncio.wrap_future(self._pending.popleft())

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._pending.clear()


def _write_and_hash(fd: int, hasher, data: bytes) -> None:
    _write_all(fd, data)
    hasher.update(data)


def _content_range_ok(header: str, start: int, size: int) -> bool:
    m = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", header)
    if not m:
        return False
    first, last, total = int(m.group(1)), int(m.group(2)), m.group(3)
    return first == start and last == size - 1 and (total == "*" or int(total) == size)


def check_disk(blobs_dir: str, needed: int, disk_reserve: int) -> None:
    """PullError 507 unless `needed` bytes fit in blobs_dir's free space above disk_reserve."""
    if needed <= 0:
        return
    free = shutil.disk_usage(blobs_dir).free
    if needed > free - disk_reserve:
        raise PullError(f"not enough disk space in {blobs_dir}: the model needs {needed} bytes, "
                        f"{free} are free and {disk_reserve} are kept in reserve", 507)


# ---------------------------------------------------------------- shared pulls

class _Download:
    def __init__(self, layer: Layer):
        self.layer = layer
        self.completed = 0
        self.waiters = 0
        self.listeners: set[asyncio.Event] = set()
        self.task: asyncio.Task | None = None

    def progress(self, completed: int, total: int) -> None:
        self.completed = completed
        for event in self.listeners:
            event.set()

    def wake(self, _task=None) -> None:
        for event in self.listeners:
            event.set()


class Puller:
    """Shares downloads: two pulls needing the same blob at once use one download."""

    def __init__(self, client_factory: Callable[[], RegistryClient], blobs_dir: str,
                 disk_reserve: int = 1 << 30):
        self.client_factory = client_factory
        self.blobs_dir = blobs_dir
        self.disk_reserve = disk_reserve
        self._inflight: dict[str, _Download] = {}

    async def pull(self, ref: Reference) -> AsyncIterator[dict]:
        yield {"status": "pulling manifest"}
        client = self.client_factory()
        try:
            manifest = await client.manifest(ref)
            max_blob = client.max_blob_bytes
        finally:
            await client.aclose()
        manifest.model_layer                    # exactly one GGUF layer, or PullError
        blobs = manifest.blobs()
        for layer in blobs:
            if layer.size > max_blob:
                raise PullError(f"blob {layer.digest} is {layer.size} bytes, more than the limit of "
                                f"{max_blob} bytes", 413)
        os.makedirs(self.blobs_dir, exist_ok=True)
        check_disk(self.blobs_dir, self._missing_bytes(blobs), self.disk_reserve)
        for layer in blobs:
            async with contextlib.aclosing(self._follow(ref, layer)) as events:
                async for event in events:
                    yield event
        yield {"status": "verifying sha256 digest"}
        yield {"status": "writing manifest"}
        yield {"status": "success", "manifest": manifest}

    def _missing_bytes(self, blobs: list[Layer]) -> int:
        missing = 0
        for layer in blobs:
            if layer.digest in self._inflight:
                continue
            final = os.path.join(self.blobs_dir, f"sha256-{layer.hex}")
            if os.path.exists(final):
                continue
            try:
                have = os.lstat(final + ".partial").st_size
            except FileNotFoundError:
                have = 0
            missing += layer.size - have if have <= layer.size else layer.size
        return missing

    def _start(self, ref: Reference, layer: Layer) -> _Download:
        download = self._inflight.get(layer.digest)
        if download is not None and download.layer.size == layer.size:
            return download
        download = _Download(layer)

        async def run() -> str:
            client = self.client_factory()
            try:
                return await client.fetch_blob(ref, layer, self.blobs_dir, progress=download.progress,
                                               disk_reserve=self.disk_reserve)
            finally:
                await client.aclose()

        download.task = asyncio.get_running_loop().create_task(run(), name=f"pull {layer.digest[:19]}")

        def done(task: asyncio.Task) -> None:
            if self._inflight.get(layer.digest) is download:
                del self._inflight[layer.digest]
            download.wake()
            if not task.cancelled():
                task.exception()                # retrieved here; waiters re-raise it
        download.task.add_done_callback(done)
        self._inflight[layer.digest] = download
        return download

    async def _follow(self, ref: Reference, layer: Layer) -> AsyncIterator[dict]:
        download = self._start(ref, layer)
        status = f"pulling {layer.hex[:12]}"
        event = asyncio.Event()
        download.listeners.add(event)
        download.waiters += 1
        task = download.task
        try:
            last = -1
            while not task.done():
                if download.completed != last:
                    last = download.completed
                    yield {"status": status, "digest": layer.digest, "total": layer.size, "completed": last}
                    await asyncio.wait([task], timeout=PROGRESS_INTERVAL)
                    continue
                await event.wait()
                event.clear()
            if task.cancelled():
                raise PullError(f"the download of {layer.digest} was cancelled")
            task.result()
            yield {"status": status, "digest": layer.digest, "total": layer.size, "completed": layer.size}
        finally:
            download.listeners.discard(event)
            download.waiters -= 1
            if download.waiters == 0 and not task.done():
                task.cancel()                   # nobody wants it any more; the partial stays
