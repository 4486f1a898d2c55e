"""A small registry on loopback that serves one model and misbehaves on purpose.

`MisbehavingRegistry(host)` runs http.server in a thread. Tests set, per blob digest, a
behaviour in `blob_modes`:
  "ok"             200 with the blob (206 for a valid Range request)
  "truncate"       Content-Length of the full blob, half the body, then close
  "bad_length"     a Content-Length larger than the declared size, the real body, close
  "long"           no Content-Length: the blob plus extra bytes, then close
  "endless"        no Content-Length: the blob, then up to 1 GiB more (count in `sent`)
  "wrong_content"  right length, other bytes
  "stall"          Content-Length of the full blob, half the body, then silence
                   (until stop(); the client's stall timeout must fire)
  "stall_headers"  no answer at all (until stop())
  "ignore_range"   always 200 with the whole blob, even for a Range request
  "bad_range"      206 with a Content-Range that starts elsewhere
  ("redirect", url) 307 to url
`redirects` maps other paths to 307 targets, `extra_paths` to 200 bodies.
Every request is recorded (method, path, headers) in `requests`.
`require_bearer(realm, token)` makes every /v2/ request need `Authorization: Bearer token`
and answer 401 with a Bearer challenge otherwise; `/token` issues tokens (optionally only
with basic credentials) and records what arrived.
Another host: start a second instance with host="127.0.0.2".
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def make_manifest(layers: list[tuple[str, str, int]], config: tuple[str, int] | None = None) -> bytes:
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_V2,
           "layers": [{"mediaType": m, "digest": d, "size": n} for m, d, n in layers]}
    if config is not None:
        doc["config"] = {"mediaType": CONFIG_V1, "digest": config[0], "size": config[1]}
    return json.dumps(doc).encode()


class MisbehavingRegistry:
    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.manifests: dict[str, bytes] = {}        # "ns/name:tag" -> body
        self.blobs: dict[str, bytes] = {}            # digest -> bytes
        self.blob_modes: dict[str, object] = {}      # digest -> behaviour
        self.extra_paths: dict[str, bytes] = {}      # any other path -> body (redirect targets)
        self.redirects: dict[str, str] = {}          # any other path -> 307 Location
        self.sent: dict[str, int] = {}               # digest -> bytes written in "endless" mode
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.bearer: dict | None = None
        self.token_basic: tuple[str, str] | None = None   # credentials /token insists on
        self.token_key = "token"
        self.release = threading.Event()
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                with owner.lock:
                    owner.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                try:
                    owner._handle(self)
                except (ConnectionError, TimeoutError):
                    self.close_connection = True     # the client gave up first: expected here

            def do_HEAD(self) -> None:
                self.send_error(405)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "MisbehavingRegistry":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "MisbehavingRegistry":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- content

    def add_model(self, repo: str, tag: str, layers: list[tuple[str, bytes]],
                  config: bytes | None = b'{"model_format":"gguf"}') -> bytes:
        entries = []
        for media, data in layers:
            self.blobs[digest_of(data)] = data
            entries.append((media, digest_of(data), len(data)))
        cfg = None
        if config is not None:
            self.blobs[digest_of(config)] = config
            cfg = (digest_of(config), len(config))
        body = make_manifest(entries, cfg)
        self.manifests[f"{repo}:{tag}"] = body
        return body

    def require_bearer(self, realm: str, token: str = "tok-123", service: str = "test-registry") -> None:
        self.bearer = {"realm": realm, "token": token, "service": service}

    def seen(self, path_part: str) -> list[tuple[str, str, dict[str, str]]]:
        with self.lock:
            return [r for r in self.requests if path_part in r[1]]

    # ---- behaviour

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict | None = None) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        if path == "/token":
            return self._token(h)
        if path in self.redirects:
            return self._send(h, 307, b"", {"Location": self.redirects[path]})
        if path in self.extra_paths:
            return self._send(h, 200, self.extra_paths[path], {"Content-Type": "application/octet-stream"})
        if self.bearer is not None and path.startswith("/v2/"):
            if h.headers.get("Authorization") != f"Bearer {self.bearer['token']}":
                m = re.match(r"^/v2/(.+)/(manifests|blobs)/", path)
                scope = f"repository:{m.group(1) if m else ''}:pull"
                challenge = (f'Bearer realm="{self.bearer["realm"]}",service="{self.bearer["service"]}",'
                             f'scope="{scope}"')
                return self._send(h, 401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                                  {"WWW-Authenticate": challenge, "Content-Type": "application/json"})
        m = re.match(r"^/v2/(.+)/manifests/([^/]+)$", path)
        if m:
            body = self.manifests.get(f"{m.group(1)}:{m.group(2)}")
            if body is None:
                return self._send(h, 404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
            return self._send(h, 200, body, {"Content-Type": MANIFEST_V2})
        m = re.match(r"^/v2/(.+)/blobs/(.+)$", path)
        if m:
            return self._blob(h, m.group(2))
        self._send(h, 404, b"not found")

    def _token(self, h: BaseHTTPRequestHandler) -> None:
        if self.token_basic is not None:
            user, password = self.token_basic
            expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            if h.headers.get("Authorization") != expected:
                return self._send(h, 401, b'{"error":"bad credentials"}')
        token = self.bearer["token"] if self.bearer else "tok-foreign"
        self._send(h, 200, json.dumps({self.token_key: token, "expires_in": 300}).encode(),
                   {"Content-Type": "application/json"})

    def _blob(self, h: BaseHTTPRequestHandler, digest: str) -> None:
        data = self.blobs.get(digest)
        if data is None:
            return self._send(h, 404, b'{"errors":[{"code":"BLOB_UNKNOWN"}]}')
        mode = self.blob_modes.get(digest, "ok")
        octet = {"Content-Type": "application/octet-stream"}
        if isinstance(mode, tuple) and mode[0] == "redirect":
            return self._send(h, 307, b"", {"Location": mode[1]})
        rng = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", "") or "")
        if mode in ("ok", "bad_range") and rng and int(rng.group(1)) < len(data):
            start = int(rng.group(1)) + (1 if mode == "bad_range" else 0)
            return self._send(h, 206, data[start:], {
                **octet, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"})
        if mode in ("ok", "ignore_range", "bad_range"):
            return self._send(h, 200, data, octet)
        if mode == "wrong_content":
            return self._send(h, 200, bytes(b ^ 0xFF for b in data), octet)
        h.close_connection = True
        if mode == "truncate":
            _head_200(h, ("Content-Length", str(len(data))))
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
        elif mode == "bad_length":
            self._send(h, 200, data, {**octet, "Content-Length": str(len(data) + 10)})
        elif mode == "long":
            _head_200(h, ("Connection", "close"))
            h.wfile.write(data + b"x" * 4096)
            h.wfile.flush()
        elif mode == "endless":
            _head_200(h, ("Connection", "close"))
            block, sent = b"z" * (1 << 20), 0
            try:
                h.wfile.write(data)
                while sent < (1 << 30):
                    h.wfile.write(block)
                    sent += len(block)
            except OSError:
                pass
            self.sent[digest] = sent
        elif mode == "stall_headers":
            self.release.wait(60)
        elif mode == "stall":
            _head_200(h, ("Content-Length", str(len(data))))
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            self.release.wait(60)
        else:
            raise AssertionError(f"unknown blob mode {mode!r}")


def _head_200(h, header: tuple[str, str]) -> None:
    """A 200's status line and one header: what a misbehaving blob answer starts with."""
    h.send_response(200)
    h.send_header(*header)
    h.end_headers()
