"""The rate limiter (server/auth/ratelimit.py) through RateLimiter: a token bucket per key and
group, exactly the limit then 429, refills at the limit's rate, its headers, overrides."""
import pytest

from stackd.auth.ratelimit import RateLimiter
from stackd.http.errors import ApiError, ErrorKind


class Metrics:
    def __init__(self):
        self.rejected = []

    def rate_limit_rejected(self, group):
        self.rejected.append(group)


def refused(call, *args) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    return caught.value


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


# ---- at its edges -----------------------------------------------------------------------------

def test_a_group_without_a_limit_is_unlimited():
    limiter = RateLimiter({"inference": 1}, {"k": {"cluster": 5}}, clock=Clock())
    for _ in range(50):
        assert limiter.admit("id", "k", "models") == b""
        assert limiter.admit("id", "other", "cluster") == b""


def test_an_override_for_another_group_leaves_the_deployment_limit():
    limiter = RateLimiter({"inference": 1}, {"k": {"cluster": 5}}, clock=Clock())
    limiter.admit("id", "k", "inference")
    assert refused(limiter.admit, "id", "k", "inference").kind is ErrorKind.RATE_LIMIT


def test_the_429_tells_when_to_retry_and_counts_the_refusal():
    clock, metrics = Clock(), Metrics()
    limiter = RateLimiter({"inference": 6}, clock=clock, metrics=metrics)   # one per 10 s
    for _ in range(6):
        limiter.admit("id", "k", "inference")
    clock.now += 2.5
    error = refused(limiter.admit, "id", "k", "inference")
    assert error.kind is ErrorKind.RATE_LIMIT
    assert error.message == ("rate limit of 6 requests per minute exceeded for the inference "
                             "group; retry after 8 s")
    assert error.headers == ((b"retry-after", b"8"), (b"x-ratelimit-limit", b"6"),
                             (b"x-ratelimit-remaining", b"0"), (b"x-ratelimit-reset", b"58"))
    assert metrics.rejected == ["inference"]
    clock.now += 7.5
    assert headers_of(limiter.admit("id", "k", "inference"))[b"x-ratelimit-remaining"] == 0


def test_retry_after_is_at_least_one_second():
    clock = Clock()
    limiter = RateLimiter({"inference": 60}, clock=clock)
    for _ in range(60):
        limiter.admit("id", "k", "inference")
    clock.now += 0.9999
    error = refused(limiter.admit, "id", "k", "inference")
    assert dict(error.headers)[b"retry-after"] == b"1"


def test_a_token_refills_at_exactly_limit_per_minute():
    clock = Clock()
    limiter = RateLimiter({"inference": 120}, clock=clock)              # one per half second
    for _ in range(120):
        limiter.admit("id", "k", "inference")
    clock.now += 0.5
    limiter.admit("id", "k", "inference")
    refused(limiter.admit, "id", "k", "inference")


def test_refused_requests_do_not_spend_tokens():
    clock = Clock()
    limiter = RateLimiter({"inference": 60}, clock=clock)
    for _ in range(60):
        limiter.admit("id", "k", "inference")
    for _ in range(5):
        clock.now += 0.1
        refused(limiter.admit, "id", "k", "inference")
    clock.now += 0.5                                                    # 1 s since the last token
    limiter.admit("id", "k", "inference")


def test_the_headers_follow_every_change_of_remaining_and_reset():
    clock = Clock()
    limiter = RateLimiter({"inference": 120}, clock=clock)
    seen = [headers_of(limiter.admit("id", "k", "inference")) for _ in range(23)]
    assert [h[b"x-ratelimit-remaining"] for h in seen] == list(range(119, 96, -1))
    assert [h[b"x-ratelimit-reset"] for h in seen] == [(120 - r + 1) // 2 for r in range(119, 96, -1)]
    assert all(h[b"x-ratelimit-limit"] == 120 for h in seen)


def test_forgetting_keeps_the_live_keys_buckets():
    limiter = RateLimiter({"inference": 1, "cluster": 1}, clock=Clock())
    for key_id in ("a", "b"):
        limiter.admit(key_id, "k", "inference")
        limiter.admit(key_id, "k", "cluster")
    limiter.forget_except({"a"})
    refused(limiter.admit, "a", "k", "inference")
    refused(limiter.admit, "a", "k", "cluster")
    limiter.admit("b", "k", "inference")
    limiter.admit("b", "k", "cluster")
