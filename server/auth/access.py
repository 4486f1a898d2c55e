"""The node API's keys and their rate limits, together: a key revoked or added in the key file
is seen on the next sweep, and the limiter forgets the buckets of keys that are gone."""
from __future__ import annotations

from .keys import KeyStore
from .ratelimit import RateLimiter


class NodeAccess:
    def __init__(self, keys: KeyStore, limiter: RateLimiter):
        self.keys = keys
        self.limiter = limiter

    def reload_keys(self) -> None:
        if self.keys.reload_if_changed():
            self.limiter.forget_except({record.id for record in self.keys.records()})
