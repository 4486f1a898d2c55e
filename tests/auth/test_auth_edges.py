"""Keys, the guard and the rate limiter at their edges, through KeyStore, KeyGuard and
RateLimiter: what a client sees (status, message, headers) and what the key file holds."""
import os
import re
import stat

import orjson
import pytest

from stackd.auth import permissions
from stackd.auth.guard import KeyGuard
from stackd.auth.keys import KeyStore, bootstrap_admin_key
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


class Metrics:
    def __init__(self):
        self.rejected = []

    def rate_limit_rejected(self, group):
        self.rejected.append(group)


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


# ---- the guard ---------------------------------------------------------------------------------

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


# ---- the key store -----------------------------------------------------------------------------

def test_a_new_key_has_256_bits_an_id_and_a_hint(store):
    record, key = store.create("app", frozenset({permissions.INFERENCE}))
    assert re.fullmatch(r"sk-[A-Za-z0-9_-]{43}", key)
    assert re.fullmatch(r"key_[0-9a-f]{12}", record.id)
    assert record.hint == key[:8] and record.name == "app"
    assert record.permissions == frozenset({permissions.INFERENCE}) == record.allowed


def test_the_key_file_lists_each_key_without_its_secret(store, tmp_path):
    record, key = store.create("app", frozenset({permissions.MODELS_MANAGE, permissions.INFERENCE}))
    saved = orjson.loads((tmp_path / "keys.json").read_bytes())
    assert saved == {"version": 1, "keys": [{
        "id": record.id, "name": "app", "sha256": record.digest.hex(),
        "permissions": ["inference", "models:manage"], "created_at": record.created_at,
        "hint": key[:8]}]}
    assert stat.S_IMODE(os.stat(tmp_path / "keys.json.lock").st_mode) == 0o600


def test_a_key_file_without_hints_still_loads(tmp_path):
    (tmp_path / "keys.json").write_bytes(orjson.dumps({"version": 1, "keys": [{
        "id": "key_1", "name": "old", "sha256": "00" * 32, "permissions": ["admin"],
        "created_at": "7"}]}))
    [record] = KeyStore(str(tmp_path)).records()
    assert (record.hint, record.created_at, record.allowed) == ("", 7, frozenset(permissions.ALL))


def test_a_key_file_without_a_key_list_holds_no_keys(tmp_path):
    (tmp_path / "keys.json").write_bytes(b'{"version": 1}')
    store = KeyStore(str(tmp_path))
    assert store.records() == [] and store.is_empty() and store.lookup(b"sk-x") is None


def test_records_are_listed_oldest_first_then_by_name(tmp_path):
    keys = [{"id": f"key_{i}", "name": name, "sha256": f"{i:064x}", "permissions": ["inference"],
             "created_at": created} for i, (name, created) in enumerate(
                 [("b", 2), ("c", 1), ("a", 2), ("d", 3)])]
    (tmp_path / "keys.json").write_bytes(orjson.dumps({"version": 1, "keys": keys}))
    assert [r.name for r in KeyStore(str(tmp_path)).records()] == ["c", "a", "b", "d"]


def test_an_empty_store_has_no_records_and_stays_at_generation_zero(store):
    assert store.records() == [] and store.is_empty()
    assert store.generation == 0
    assert not store.reload_if_changed() and store.generation == 0


def test_each_change_bumps_the_generation_once(store):
    _, key = store.create("a", frozenset({permissions.INFERENCE}))
    assert store.generation == 1 and not store.is_empty()
    store.revoke("a")
    assert store.generation == 2 and store.lookup(key.encode()) is None
    assert store.is_empty()


def test_a_deleted_key_file_empties_the_table(store, tmp_path):
    _, key = store.create("a", frozenset({permissions.INFERENCE}))
    os.unlink(tmp_path / "keys.json")
    assert store.reload_if_changed() and store.lookup(key.encode()) is None


def test_names_at_the_edge_of_the_rules(store):
    store.create("a" * 64, frozenset({permissions.INFERENCE}))
    store.create("A.b_c-9", frozenset({permissions.INFERENCE}))
    with pytest.raises(ValueError) as bad:
        store.create("a" * 65, frozenset({permissions.INFERENCE}))
    assert str(bad.value) == "key name must be 1-64 characters of letters, digits, '.', '_' or '-'"
    with pytest.raises(ValueError) as taken:
        store.create("A.b_c-9", frozenset({permissions.INFERENCE}))
    assert "'A.b_c-9' exists already" in str(taken.value)


def test_revoke_returns_the_revoked_key_and_leaves_the_others(store):
    first, _ = store.create("one", frozenset({permissions.INFERENCE}))
    second, key2 = store.create("two", frozenset({permissions.INFERENCE}))
    assert store.revoke(first.id) == first
    assert store.records() == [second] and store.lookup(key2.encode()) == second
    with pytest.raises(KeyError) as missing:
        store.revoke("one")
    assert "no key named 'one'" in str(missing.value)


def test_bootstrap_writes_the_admin_key_file(store, tmp_path):
    path = bootstrap_admin_key(store, str(tmp_path))
    assert path == str(tmp_path / "admin.key")
    text = open(path).read()
    assert text.endswith("\n") and text.count("\n") == 1
    [record] = store.records()
    assert record.name == "admin" and record.permissions == frozenset({permissions.ADMIN})
    assert store.lookup(text[:-1].encode()) == record


# ---- permissions -------------------------------------------------------------------------------

def test_permission_lists_ignore_blanks_and_name_the_first_unknown():
    assert permissions.parse(" admin ,, inference ") == frozenset({"admin", "inference"})
    with pytest.raises(ValueError) as unknown:
        permissions.parse("inference, root, sudo")
    assert str(unknown.value) == ("unknown permission 'root'; choose from inference, cluster:read, "
                                  "cluster:write, models:manage, admin")
    with pytest.raises(ValueError) as empty:
        permissions.parse(",")
    assert str(empty.value) == "at least one permission is required"


def test_only_admin_expands():
    granted = frozenset({permissions.INFERENCE, permissions.CLUSTER_WRITE})
    assert permissions.effective(granted) == granted
    assert permissions.effective(frozenset({permissions.ADMIN})) == frozenset(permissions.ALL)


# ---- the rate limiter --------------------------------------------------------------------------

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
