import pytest

from stackd.auth.ratelimit import RateLimiter
from stackd.http.errors import ApiError


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def headers_of(lines: bytes) -> dict[bytes, int]:
    out = {}
    for line in lines.split(b"\r\n"):
        if line:
            name, _, value = line.partition(b": ")
            out[name] = int(value)
    return out


def test_exactly_the_limit_passes_then_429():
    limiter = RateLimiter({"inference": 100}, clock=Clock())
    for i in range(100):
        headers = headers_of(limiter.admit("k1", "a", "inference"))
        assert headers[b"x-ratelimit-limit"] == 100
        assert headers[b"x-ratelimit-remaining"] == 99 - i
    with pytest.raises(ApiError) as refused:
        limiter.admit("k1", "a", "inference")
    error = refused.value
    assert error.kind.status == 429 and error.kind.type == "rate_limit_error"
    extra = dict(error.headers)
    assert int(extra[b"retry-after"]) >= 1
    assert extra[b"x-ratelimit-remaining"] == b"0"


def test_tokens_come_back_at_the_limit_rate():
    clock = Clock()
    limiter = RateLimiter({"inference": 60}, clock=clock)   # one per second
    for _ in range(60):
        limiter.admit("k1", "a", "inference")
    with pytest.raises(ApiError) as refused:
        limiter.admit("k1", "a", "inference")
    assert dict(refused.value.headers)[b"retry-after"] == b"1"
    clock.now += 1.0
    limiter.admit("k1", "a", "inference")
    with pytest.raises(ApiError):
        limiter.admit("k1", "a", "inference")


def test_keys_and_groups_have_separate_buckets():
    limiter = RateLimiter({"inference": 1, "cluster": 1}, clock=Clock())
    limiter.admit("k1", "a", "inference")
    limiter.admit("k1", "a", "cluster")
    limiter.admit("k2", "b", "inference")
    with pytest.raises(ApiError):
        limiter.admit("k1", "a", "inference")


def test_per_key_override_and_unlimited():
    limiter = RateLimiter({"inference": 1}, {"big": {"inference": 3}, "free": {"inference": 0}},
                          clock=Clock())
    for _ in range(3):
        limiter.admit("k1", "big", "inference")
    with pytest.raises(ApiError):
        limiter.admit("k1", "big", "inference")
    for _ in range(1000):
        assert limiter.admit("k2", "free", "inference") == b""


def test_revoked_keys_lose_their_buckets():
    limiter = RateLimiter({"inference": 1}, clock=Clock())
    limiter.admit("gone", "a", "inference")
    limiter.admit("kept", "b", "inference")
    limiter.forget_except({"kept"})
    limiter.admit("gone", "a", "inference")          # a fresh bucket
    with pytest.raises(ApiError):
        limiter.admit("kept", "b", "inference")


def test_reset_header_counts_seconds_to_full():
    clock = Clock()
    limiter = RateLimiter({"cluster": 60}, clock=clock)
    for _ in range(30):
        last = limiter.admit("k", "a", "cluster")
    assert headers_of(last)[b"x-ratelimit-reset"] == 30


def test_a_long_idle_bucket_refills_only_to_its_limit():
    clock = Clock()
    limiter = RateLimiter({"inference": 60}, clock=clock)
    limiter.admit("k1", "a", "inference")
    clock.now += 600.0                              # ten idle minutes
    for _ in range(60):
        limiter.admit("k1", "a", "inference")
    with pytest.raises(ApiError):
        limiter.admit("k1", "a", "inference")


def test_a_refusal_is_held_back_at_most_until_its_retry_after():
    clock = Clock()
    limiter = RateLimiter({"inference": 60}, clock=clock, refusal_delay=1.0)
    for _ in range(60):
        limiter.admit("k1", "a", "inference")
    with pytest.raises(ApiError) as refused:
        limiter.admit("k1", "a", "inference")
    assert refused.value.delay == 1.0                       # Retry-After is 1 s here: the same
    slow = RateLimiter({"inference": 1}, clock=clock, refusal_delay=5.0)
    slow.admit("k1", "a", "inference")
    with pytest.raises(ApiError) as refused:
        slow.admit("k1", "a", "inference")
    retry_after = int(dict(refused.value.headers)[b"retry-after"])
    assert refused.value.delay == min(5.0, retry_after)      # never later than it says to retry
    at_once = RateLimiter({"inference": 1}, clock=clock)      # refusal_delay 0: answered at once
    at_once.admit("k1", "a", "inference")
    with pytest.raises(ApiError) as refused:
        at_once.admit("k1", "a", "inference")
    assert refused.value.delay == 0.0
