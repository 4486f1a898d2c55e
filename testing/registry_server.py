"""The real CNCF distribution registry (Debian package `docker-registry`) on a free loopback port.

Storage is the filesystem driver in a temporary directory. Content is pushed through the
registry's own HTTP API (monolithic blob upload, then PUT of the manifest), exactly as a
`docker push` or `ollama push` would. No config tweak is needed for Ollama's layer media
types: distribution 2.8 stores and serves any layer media type in a schema-2 manifest; it
only requires every referenced blob to exist before the manifest PUT.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time

import httpx2

from .daemon import free_port

BINARY = "/usr/bin/docker-registry"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
MEDIA_MODEL = "application/vnd.ollama.image.model"
MEDIA_TEMPLATE = "application/vnd.ollama.image.template"
MEDIA_PARAMS = "application/vnd.ollama.image.params"

CONFIG_TEMPLATE = """\
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
  secret: {secret}
health:
  storagedriver:
    enabled: false
"""


def require_binary() -> None:
    if not os.access(BINARY, os.X_OK):
        raise RuntimeError(f"{BINARY} is missing: run `apt-get install docker-registry` "
                           "(the Makefile's test setup installs it)")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class RegistryServer:
    def __init__(self, workdir: str | None = None):
        require_binary()
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="stackd-registry-")
        self.root = os.path.join(self.workdir, "storage")
        os.makedirs(self.root, exist_ok=True)
        self.log_path = os.path.join(self.workdir, "registry.log")
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.http: httpx2.Client | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: float = 30.0) -> "RegistryServer":
        for _ in range(5):                   # another process may take the port between probe and bind
            self.port = free_port()
            config = os.path.join(self.workdir, "config.yml")
            with open(config, "w") as f:
                f.write(CONFIG_TEMPLATE.format(root=self.root, port=self.port, secret=secrets.token_hex(16)))
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen([BINARY, "serve", config], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.workdir)
            log.close()
            self.http = httpx2.Client(base_url=self.url, timeout=10.0, trust_env=False)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.http.get("/v2/").status_code == 200:
                        return self
                except httpx2.TransportError:
                    pass
                time.sleep(0.05)
            self.http.close()
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                break
        raise RuntimeError(f"docker-registry did not start; log:\n{self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.http is not None:
            self.http.close()
            self.http = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "RegistryServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- pushing through the registry's HTTP API ---

    def push_blob(self, repo: str, data: bytes) -> str:
        digest = digest_of(data)
        r = self.http.post(f"/v2/{repo}/blobs/uploads/")
        assert r.status_code == 202, (r.status_code, r.text)
        # Location is absolute or relative, and carries the upload's _state in its query:
        # the digest is added to that query (a `params=` argument would replace it).
        location = self.http.base_url.join(r.headers["Location"]).copy_merge_params({"digest": digest})
        r = self.http.put(location, content=data,
                          headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 201, (r.status_code, r.text)
        assert r.headers.get("Docker-Content-Digest") == digest
        return digest

    def push_manifest(self, repo: str, tag: str, body: bytes, content_type: str = MANIFEST_V2) -> str:
        r = self.http.put(f"/v2/{repo}/manifests/{tag}", content=body, headers={"Content-Type": content_type})
        assert r.status_code == 201, (r.status_code, r.text)
        return r.headers.get("Docker-Content-Digest", "")

    def push_model(self, repo: str, tag: str, blobs: list[tuple[str, bytes]], config: bytes | None = None) -> dict:
        """Push each (media type, bytes) layer, an Ollama-style config, and the manifest.
        Returns {"manifest": bytes, "layers": [(media, digest, size)], "config": (digest, size)}."""
        if config is None:
            config = json.dumps({"model_format": "gguf", "model_family": "llama",
                                 "model_type": "tiny", "file_type": "Q8_0",
                                 "rootfs": {"type": "layers", "diff_ids": []}}).encode()
        config_digest = self.push_blob(repo, config)
        layers = [(media, self.push_blob(repo, data), len(data)) for media, data in blobs]
        manifest = json.dumps({
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {"mediaType": CONFIG_V1, "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": m, "digest": d, "size": n} for m, d, n in layers],
        }, indent=3).encode()
        self.push_manifest(repo, tag, manifest)
        return {"manifest": manifest, "layers": layers, "config": (config_digest, len(config))}
