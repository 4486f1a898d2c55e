"""The node API's guard (server/auth/guard.py) through KeyGuard, at its edges: what a client sees
(status, message, headers) for each credential, the per-connection cache, and the order of its
checks (permission before the rate limit)."""
import pytest

from stackd.auth import permissions
from stackd.auth.guard import KeyGuard
from stackd.auth.keys import KeyStore
from stackd.auth.ratelimit import RateLimiter
from stackd.http.errors import ApiError, ErrorKind
from stackd.http.request import Session


class Route:
    def __init__(self, permission=permissions.INFERENCE, group="inference"):
        self.permission = permission
        self.group = group


class Request:
    def __init__(self, authorization: bytes | None, session: Session | None = None):
        self.headers = {} if authorization is None else {b"authorization": authorization}
        self.session = session or Session()
        self.key = None
        self.rate_headers = b""


class Clock:
    def __init__(self):
        self.now = 5000.0

    def __call__(self):
        return self.now


def bearer(key: str) -> bytes:
    return b"Bearer " + key.encode()


def headers_of(lines: bytes) -> dict[bytes, int]:
    return {name: int(value) for name, _, value in
            (line.partition(b": ") for line in lines.split(b"\r\n") if line)}


@pytest.fixture
def store(tmp_path):
    return KeyStore(str(tmp_path))


def refused(call, *args) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    return caught.value


def test_a_revoked_key_stops_working_on_a_keep_alive_connection(store):
    record, key = store.create("app", frozenset({permissions.INFERENCE}))
    guard = KeyGuard(store, RateLimiter({"inference": 0}))
    session = Session()                             # one connection, kept alive
    guard(Request(bearer(key), session), Route(permissions.INFERENCE))
    assert session.principal is not None            # cached for the next request
    store.revoke("app")
    with pytest.raises(ApiError) as refused:
        guard(Request(bearer(key), session), Route(permissions.INFERENCE))
    assert refused.value.kind.status == 401


def test_the_cache_skips_rehashing_while_the_store_is_unchanged(store, monkeypatch):
    _, key = store.create("app", frozenset({permissions.INFERENCE}))
    guard = KeyGuard(store, RateLimiter({"inference": 0}))
    session = Session()
    guard(Request(bearer(key), session), Route(permissions.INFERENCE))
    monkeypatch.setattr(store, "lookup", lambda token: pytest.fail("looked up again"))
    guard(Request(bearer(key), session), Route(permissions.INFERENCE))


def test_permission_is_checked_before_the_rate_limit(store):
    """A key without the permission gets 403 and spends none of its rate budget."""
    _, key = store.create("reader", frozenset({permissions.CLUSTER_READ}))
    guard = KeyGuard(store, RateLimiter({"inference": 2, "cluster": 2}))
    for _ in range(5):
        with pytest.raises(ApiError) as refused:
            guard(Request(bearer(key), Session()), Route(permissions.INFERENCE, "inference"))
        assert refused.value.kind.status == 403
    for _ in range(2):                              # the cluster budget is whole
        guard(Request(bearer(key), Session()), Route(permissions.CLUSTER_READ, "cluster"))


def test_a_missing_or_malformed_credential_is_401_with_a_challenge(store):
    guard = KeyGuard(store, RateLimiter({}))
    for header in (None, b"Basic abc", b"Bearer "):
        error = refused(guard, Request(header), Route(permissions.INFERENCE))
        assert error.kind.status == 401
        assert dict(error.headers)[b"www-authenticate"].startswith(b"Bearer")


def test_a_missing_key_is_401_saying_how_to_send_one(store):
    error = refused(KeyGuard(store, RateLimiter({})), Request(None), Route())
    assert error.kind is ErrorKind.AUTHENTICATION
    assert error.message == "missing API key: send 'Authorization: Bearer <key>'"
    assert error.headers == ((b"www-authenticate", b'Bearer realm="stackd"'),)


@pytest.mark.parametrize("header", [b"Basic abc", b"Bearer", b"Bearer    ", b"Token sk-x"])
def test_a_malformed_header_is_401_malformed(store, header):
    error = refused(KeyGuard(store, RateLimiter({})), Request(header), Route())
    assert error.kind is ErrorKind.AUTHENTICATION
    assert error.message == "malformed Authorization header: expected 'Bearer <key>'"
    assert dict(error.headers)[b"www-authenticate"] == b'Bearer realm="stackd"'


def test_an_unknown_key_is_401_invalid(store):
    error = refused(KeyGuard(store, RateLimiter({})), Request(b"Bearer sk-unknown"), Route())
    assert error.kind is ErrorKind.AUTHENTICATION and error.message == "invalid API key"
    assert dict(error.headers)[b"www-authenticate"] == b'Bearer realm="stackd"'


@pytest.mark.parametrize("scheme", [b"Bearer", b"bearer", b"BEARER"])
def test_the_scheme_is_case_insensitive_and_the_token_trimmed(store, scheme):
    record, key = store.create("app", frozenset({permissions.INFERENCE}))
    request = Request(scheme + b" " + key.encode() + b"  ")
    KeyGuard(store, RateLimiter({}))(request, Route())
    assert request.key.id == record.id          # the principal the key resolved to


def test_a_token_with_a_space_inside_is_not_cut_at_the_last_space(store):
    _, key = store.create("app", frozenset({permissions.INFERENCE}))
    error = refused(KeyGuard(store, RateLimiter({})), Request(b"Bearer x " + key.encode()), Route())
    assert error.message == "invalid API key"


def test_another_key_on_the_same_connection_is_authenticated_afresh(store):
    first, key1 = store.create("one", frozenset({permissions.INFERENCE}))
    second, key2 = store.create("two", frozenset({permissions.CLUSTER_READ}))
    guard = KeyGuard(store, RateLimiter({}))
    session = Session()
    request = Request(bearer(key1), session)
    guard(request, Route())
    assert request.key.id == first.id
    request = Request(bearer(key2), session)
    guard(request, Route(permissions.CLUSTER_READ, "cluster"))
    assert request.key.id == second.id
    assert refused(guard, Request(bearer(key2), session), Route()).kind is ErrorKind.PERMISSION
    assert refused(guard, Request(b"Bearer sk-wrong", session), Route()).kind \
        is ErrorKind.AUTHENTICATION


def test_the_cached_key_is_used_on_later_requests(store):
    record, key = store.create("app", frozenset({permissions.INFERENCE}))
    guard = KeyGuard(store, RateLimiter({}))
    session = Session()
    guard(Request(bearer(key), session), Route())
    request = Request(bearer(key), session)
    guard(request, Route())
    assert request.key.id == record.id and session.principal.id == record.id
    assert session.credential == bearer(key) and session.generation == store.generation


def test_a_key_lacking_the_permission_is_403_naming_it(store):
    _, key = store.create("reader", frozenset({permissions.CLUSTER_READ}))
    error = refused(KeyGuard(store, RateLimiter({})), Request(bearer(key)), Route(permissions.MODELS_MANAGE))
    assert error.kind is ErrorKind.PERMISSION
    assert error.message == "this API key lacks the 'models:manage' permission"


def test_a_route_without_a_permission_or_group_takes_any_key(store):
    _, key = store.create("reader", frozenset({permissions.CLUSTER_READ}))
    limiter = RateLimiter({"inference": 1})
    request = Request(bearer(key))
    for _ in range(3):
        KeyGuard(store, limiter)(request, Route(permission=None, group=None))
    assert request.rate_headers == b""


def test_the_guard_hands_the_rate_headers_to_the_request(store):
    _, key = store.create("app", frozenset({permissions.INFERENCE}))
    request = Request(bearer(key))
    KeyGuard(store, RateLimiter({"inference": 10}, clock=Clock()))(request, Route())
    assert headers_of(request.rate_headers) == {b"x-ratelimit-limit": 10,
                                                b"x-ratelimit-remaining": 9,
                                                b"x-ratelimit-reset": 6}


def test_each_key_has_its_own_budget_through_the_guard(store):
    _, key1 = store.create("one", frozenset({permissions.INFERENCE}))
    _, key2 = store.create("two", frozenset({permissions.INFERENCE}))
    guard = KeyGuard(store, RateLimiter({"inference": 1}, clock=Clock()))
    guard(Request(bearer(key1)), Route())
    guard(Request(bearer(key2)), Route())
    assert refused(guard, Request(bearer(key1)), Route()).kind is ErrorKind.RATE_LIMIT


def test_the_guard_limits_per_key_by_name_overrides(store):
    _, key = store.create("big", frozenset({permissions.INFERENCE}))
    guard = KeyGuard(store, RateLimiter({"inference": 1}, {"big": {"inference": 2}}, clock=Clock()))
    guard(Request(bearer(key)), Route())
    guard(Request(bearer(key)), Route())
    assert refused(guard, Request(bearer(key)), Route()).kind is ErrorKind.RATE_LIMIT
