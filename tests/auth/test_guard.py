"""The node API's guard on its own: the per-connection cache, and the order of its checks."""
import pytest

from stackd.auth import permissions
from stackd.auth.guard import KeyGuard
from stackd.auth.keys import KeyStore
from stackd.auth.ratelimit import RateLimiter
from stackd.http.errors import ApiError
from stackd.http.request import Session


class Route:
    def __init__(self, permission, group="inference"):
        self.permission = permission
        self.group = group


class Request:
    def __init__(self, key: str, session: Session):
        self.headers = {b"authorization": b"Bearer " + key.encode()}
        self.session = session
        self.key = None
        self.rate_headers = b""


@pytest.fixture
def store(tmp_path):
    return KeyStore(str(tmp_path))


def test_a_revoked_key_stops_working_on_a_keep_alive_connection(store):
    record, key = store.create("app", frozenset({permissions.INFERENCE}))
    guard = KeyGuard(store, RateLimiter({"inference": 0}))
    session = Session()                             # one connection, kept alive
    guard(Request(key, session), Route(permissions.INFERENCE))
    assert session.principal is not None            # cached for the next request
    store.revoke("app")
    with pytest.raises(ApiError) as refused:
        guard(Request(key, session), Route(permissions.INFERENCE))
    assert refused.value.kind.status == 401


def test_the_cache_skips_rehashing_while_the_store_is_unchanged(store, monkeypatch):
    _, key = store.create("app", frozenset({permissions.INFERENCE}))
    guard = KeyGuard(store, RateLimiter({"inference": 0}))
    session = Session()
    guard(Request(key, session), Route(permissions.INFERENCE))
    monkeypatch.setattr(store, "lookup", lambda token: pytest.fail("looked up again"))
    guard(Request(key, session), Route(permissions.INFERENCE))


def test_permission_is_checked_before_the_rate_limit(store):
    """A key without the permission gets 403 and spends none of its rate budget."""
    _, key = store.create("reader", frozenset({permissions.CLUSTER_READ}))
    guard = KeyGuard(store, RateLimiter({"inference": 2, "cluster": 2}))
    for _ in range(5):
        with pytest.raises(ApiError) as refused:
            guard(Request(key, Session()), Route(permissions.INFERENCE, "inference"))
        assert refused.value.kind.status == 403
    for _ in range(2):                              # the cluster budget is whole
        guard(Request(key, Session()), Route(permissions.CLUSTER_READ, "cluster"))


def test_a_missing_or_malformed_credential_is_401_with_a_challenge(store):
    guard = KeyGuard(store, RateLimiter({}))
    request = Request("x", Session())
    for header in (None, b"Basic abc", b"Bearer "):
        if header is None:
            del request.headers[b"authorization"]
        else:
            request.headers[b"authorization"] = header
        with pytest.raises(ApiError) as refused:
            guard(request, Route(permissions.INFERENCE))
        assert refused.value.kind.status == 401
        assert dict(refused.value.headers)[b"www-authenticate"].startswith(b"Bearer")
