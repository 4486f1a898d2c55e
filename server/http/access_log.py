"""Access log as JSON lines, buffered and written about twice a second.

One line per request: time, method, path, status, bytes, duration, request id,
key name (never the key), peer. Writing is batched so logging costs the hot
path one dict and one append.
"""
from __future__ import annotations

import sys
import time

import orjson


class AccessLog:
    def __init__(self, stream=None, enabled: bool = True):
        self.stream = stream if stream is not None else sys.stderr.buffer
        self.enabled = enabled
        self._lines: list[bytes] = []

    def write(self, method: str, path: str, status: int, n_bytes: int, duration: float,
              request_id: bytes, key_name: str | None, peer: str) -> None:
        if not self.enabled:
            return
        self._lines.append(orjson.dumps({
            "ts": round(time.time(), 3), "method": method, "path": path, "status": status,
            "bytes": n_bytes, "duration_ms": round(duration * 1000, 3),
            "request_id": request_id.decode("ascii"), "key": key_name, "peer": peer,
        }, option=orjson.OPT_APPEND_NEWLINE))
        if len(self._lines) >= 4096:
            self.flush()

    def flush(self) -> None:
        if self._lines:
            lines, self._lines = self._lines, []
            try:
                self.stream.write(b"".join(lines))
                self.stream.flush()
            except (OSError, ValueError):
                pass             # a closed or full log must never take the server down
