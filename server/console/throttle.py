"""Login attempts per minute, per account and per client address (token buckets).

Reuses the node's bucket (auth.ratelimit.Bucket) and its 429 with Retry-After and the
x-ratelimit-* headers. Buckets that have refilled are dropped, and past MAX_BUCKETS the
oldest half too, so a spray of made-up usernames cannot grow the table without bound (each
address can only add its own limit's worth of names per minute anyway).
"""
from __future__ import annotations

import time

from ..auth.ratelimit import Bucket, RateLimiter

GROUP = "login"
MAX_BUCKETS = 10_000


class LoginThrottle:
    def __init__(self, per_minute: int, clock=time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        self.buckets: dict[str, Bucket] = {}
        self._refuser = RateLimiter({GROUP: per_minute})

    def admit(self, username: str, address: str) -> None:
        """Take a token from both buckets, or raise 429."""
        if self.per_minute <= 0:
            return
        now = self.clock()
        if len(self.buckets) >= MAX_BUCKETS:
            self._forget_full(now)
        for name in ("user:" + username.lower(), "addr:" + address):
            bucket = self.buckets.get(name)
            if bucket is None:
                bucket = self.buckets[name] = Bucket(self.per_minute, now)
            if bucket.take(now) < 0.0:
                self._refuser.refuse(bucket, GROUP)

    def _forget_full(self, now: float) -> None:
        for name, bucket in list(self.buckets.items()):
            if bucket.tokens + (now - bucket.stamp) * bucket.rate >= bucket.limit:
                del self.buckets[name]
        if len(self.buckets) >= MAX_BUCKETS:      # still full: the oldest half goes
            for name in list(self.buckets)[:len(self.buckets) // 2]:
                del self.buckets[name]
