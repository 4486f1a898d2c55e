"""Token buckets per (API key, group).

A group's limit is N requests per minute: the bucket holds N tokens and
refills N/60 per second. A limit of 0 means unlimited. Deployment-wide limits
come from [rate_limits]; per-key overrides from [rate_limits.keys.<name>].
Compiled by Cython (typed bucket arithmetic); the same source runs as its twin.
"""
from __future__ import annotations

import math
import time

import cython

from ..http.errors import ApiError, ErrorKind


@cython.cclass
class Bucket:
    limit = cython.declare(cython.long, visibility="readonly")
    rate = cython.declare(cython.double, visibility="readonly")
    tokens = cython.declare(cython.double, visibility="public")
    stamp = cython.declare(cython.double, visibility="public")
    _headers = cython.declare(bytes)
    _shown = cython.declare(cython.long)     # remaining * 2^20 + reset the cached headers show

    def __init__(self, limit: cython.long, now: cython.double):
        self.limit = limit
        self.rate = limit / 60.0
        self.tokens = float(limit)
        self.stamp = now
        self._headers = b""
        self._shown = -1

    @cython.ccall
    def take(self, now: cython.double) -> cython.double:
        """Refill for the time passed, then take a token if there is one.
        Returns the tokens left after taking, or a negative value when refused."""
        tokens: cython.double = self.tokens + (now - self.stamp) * self.rate
        if tokens > self.limit:
            tokens = self.limit
        self.stamp = now
        if tokens < 1.0:
            self.tokens = tokens
            return -1.0
        self.tokens = tokens - 1.0
        return self.tokens

    @cython.ccall
    def reset_seconds(self) -> cython.long:
        return math.ceil((self.limit - self.tokens) / self.rate)

    @cython.ccall
    def headers(self) -> bytes:
        """x-ratelimit-* lines; the bytes are reused while the numbers stay the same."""
        remaining: cython.long = int(self.tokens)
        reset: cython.long = self.reset_seconds()
        shown: cython.long = (remaining << 20) + reset
        if shown != self._shown:
            self._shown = shown
            self._headers = b"x-ratelimit-limit: %d\r\nx-ratelimit-remaining: %d\r\nx-ratelimit-reset: %d\r\n" % (
                self.limit, remaining, reset)
        return self._headers


class RateLimiter:
    def __init__(self, limits: dict[str, int], per_key: dict[str, dict[str, int]] | None = None,
                 clock=time.monotonic, metrics=None, refusal_delay: float = 0.0):
        self.limits = dict(limits)
        # rate_limits.refusal_delay: a refusal is answered after min(this, Retry-After) seconds,
        # so a client that ignores Retry-After and retries at once cannot keep the node's cores
        # busy answering 429s (each of its connections gets at most one refusal a delay).
        self.refusal_delay = refusal_delay
        self.per_key = {name: dict(groups) for name, groups in (per_key or {}).items()}
        self.clock = clock
        self.metrics = metrics
        self._buckets: dict[tuple[str, str], Bucket | None] = {}

    def limit_for(self, key_name: str, group: str) -> int:
        override = self.per_key.get(key_name)
        if override is not None and group in override:
            return override[group]
        return self.limits.get(group, 0)

    def admit(self, key_id: str, key_name: str, group: str) -> bytes:
        """Take one token. Returns the x-ratelimit-* header lines, or raises 429."""
        now = self.clock()
        bucket_key = (key_id, group)
        bucket = self._buckets.get(bucket_key, False)
        if bucket is False:
            limit = self.limit_for(key_name, group)
            bucket = self._buckets[bucket_key] = Bucket(limit, now) if limit > 0 else None
        if bucket is None:
            return b""                   # unlimited
        if bucket.take(now) < 0.0:
            self.refuse(bucket, group)
        return bucket.headers()

    def refuse(self, bucket: Bucket, group: str) -> None:
        retry_after = max(1, math.ceil((1.0 - bucket.tokens) / bucket.rate))
        if self.metrics is not None:
            self.metrics.rate_limit_rejected(group)
        raise ApiError(ErrorKind.RATE_LIMIT,
                       f"rate limit of {bucket.limit} requests per minute exceeded for the "
                       f"{group} group; retry after {retry_after} s",
                       headers=((b"retry-after", b"%d" % retry_after),
                                (b"x-ratelimit-limit", b"%d" % bucket.limit),
                                (b"x-ratelimit-remaining", b"0"),
                                (b"x-ratelimit-reset", b"%d" % bucket.reset_seconds())),
                       delay=min(self.refusal_delay, float(retry_after)))

    def forget_except(self, live_key_ids: set[str]) -> None:
        """Drop buckets of revoked keys so the table stays bounded by the live keys."""
        for bucket_key in [k for k in self._buckets if k[0] not in live_key_ids]:
            del self._buckets[bucket_key]
