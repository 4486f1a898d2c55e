"""Access log as JSON lines, buffered on the loop and written by a thread of its own.

One line per request: time, method, path, status, bytes, duration, request id,
key name (never the key), peer; a request by one of the `quiet_keys` (the embedded console's
own key: its polls of its node) only when it fails. The hot path costs one dict and one append; about twice a
second (or every 4,096 lines) the batch goes to a writer thread. The log goes to stderr,
which is a pipe to journald or a supervisor: a reader that falls behind blocks the write,
and a write on the loop stalled every client (a flood of 20,000 pipelined requests filled
the pipe and held the loop ~400 ms). So the loop never writes: it hands batches over, and
when more than MAX_PENDING_BYTES wait unwritten, new batches are dropped and counted
(serving outranks logging); a line saying how many were dropped follows once the
writer catches up.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque

import orjson

BATCH_LINES = 4096
MAX_PENDING_BYTES = 8 << 20


class AccessLog:
    def __init__(self, stream=None, enabled: bool = True, quiet_keys: frozenset[str] = frozenset()):
        self.stream = stream if stream is not None else sys.stderr.buffer
        self.enabled = enabled
        self.quiet_keys = quiet_keys        # names of keys whose requests are logged only when they fail
        self.dropped_lines = 0              # lines lost to a reader that fell behind, ever
        self._lines: list[bytes] = []
        self._batches: deque[bytes] = deque()
        self._pending_bytes = 0
        self._unreported_drops = 0
        self._wake = threading.Condition()
        self._writer: threading.Thread | None = None

    def write(self, method: str, path: str, status: int, n_bytes: int, duration: float,
              request_id: bytes, key_name: str | None, peer: str) -> None:
        if not self.enabled or (status < 400 and key_name in self.quiet_keys):
            return
        self._lines.append(orjson.dumps({
            "ts": round(time.time(), 3), "method": method, "path": path, "status": status,
            "bytes": n_bytes, "duration_ms": round(duration * 1000, 3),
            "request_id": request_id.decode("ascii"), "key": key_name, "peer": peer,
        }, option=orjson.OPT_APPEND_NEWLINE))
        if len(self._lines) >= BATCH_LINES:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered lines to the writer thread (never blocks on the stream)."""
        if not self._lines:
            return
        lines, self._lines = self._lines, []
        batch = b"".join(lines)
        with self._wake:
            if self._pending_bytes + len(batch) > MAX_PENDING_BYTES:
                self.dropped_lines += len(lines)
                self._unreported_drops += len(lines)
                return
            if self._unreported_drops:
                batch = orjson.dumps({"ts": round(time.time(), 3),
                                      "access_log_dropped_lines": self._unreported_drops},
                                     option=orjson.OPT_APPEND_NEWLINE) + batch
                self._unreported_drops = 0
            self._batches.append(batch)
            self._pending_bytes += len(batch)
            self._wake.notify()
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_forever, name="access-log",
                                            daemon=True)
            self._writer.start()

    def drain(self, timeout: float = 5.0) -> None:
        """Flush and wait (at most `timeout` s) until the writer has written everything: at
        shutdown, so the last requests are logged."""
        self.flush()
        deadline = time.monotonic() + timeout
        with self._wake:
            while self._pending_bytes and time.monotonic() < deadline:
                self._wake.wait(0.05)

    def _write_forever(self) -> None:
        while True:
            with self._wake:
                while not self._batches:
                    self._wake.wait()
                batch = self._batches[0]
            try:
                self.stream.write(batch)
                self.stream.flush()
            except (OSError, ValueError):
                pass             # a closed or broken log must never take the server down
            with self._wake:
                self._batches.popleft()
                self._pending_bytes -= len(batch)
                self._wake.notify_all()
