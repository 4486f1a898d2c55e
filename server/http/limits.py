"""Limits of the HTTP layer. Each one is configurable (config section [http])."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_head_bytes: int = 16 * 1024      # request line + headers; 414 when the URL alone passes it, else 431
    max_headers: int = 100               # header fields per request; 431 past it
    max_body_bytes: int = 1024 * 1024    # default body cap of a route; 413 before the body is read
    head_timeout: float = 10.0           # the whole head must arrive within this, from its first byte
    body_timeout: float = 30.0           # longest silence while a body is arriving
    keepalive_timeout: float = 5.0       # an idle keep-alive connection is closed after this
    write_timeout: float = 30.0          # a client that reads nothing for this long is dropped
    max_connections: int = 1024          # per port: beyond it a new connection gets 503 and is closed
    write_high_water: int = 64 * 1024    # producers wait while more than this is unsent
    max_pipeline: int = 128              # requests queued unanswered on one connection; 429 past it
    shutdown_grace: float = 30.0         # in-flight requests get this long after SIGTERM
