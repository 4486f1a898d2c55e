"""Requests without a key from listed networks (server/auth/networks.py): one inference-only
principal with its own rate limit, only for addresses inside a listed network (IPv4, IPv6 and
IPv4-mapped IPv6 peers); a key is always the key's; anyone else without one is a 401."""
import pytest

from stackd.auth import permissions
from stackd.auth.guard import KeyGuard
from stackd.auth.keys import KeyStore
from stackd.auth.networks import ANONYMOUS, NetworkGuard, address_of, parse_networks
from stackd.auth.ratelimit import RateLimiter
from stackd.http.errors import ApiError, ErrorKind
from stackd.http.request import Session


class Route:
    def __init__(self, permission=permissions.INFERENCE, group="inference"):
        self.permission, self.group = permission, group


class Request:
    def __init__(self, peer: str, authorization: bytes | None = None):
        self.peer = peer
        self.headers = {} if authorization is None else {b"authorization": authorization}
        self.session = Session()
        self.key = None
        self.rate_headers = b""


@pytest.fixture
def store(tmp_path):
    return KeyStore(str(tmp_path))


def guard_of(store, networks=("192.168.1.0/24", "fd00::/8"), limit=3) -> NetworkGuard:
    return NetworkGuard(KeyGuard(store, RateLimiter({"inference": 0})), parse_networks(networks), limit)


@pytest.mark.parametrize("peer", ["192.168.1.7:5000", "[fd00::1]:5000", "::ffff:192.168.1.9:80"])
def test_a_listed_peer_without_a_key_is_the_inference_only_principal(store, peer):
    request = Request(peer)
    guard_of(store)(request, Route())
    assert request.key is ANONYMOUS and ANONYMOUS.allowed == {permissions.INFERENCE}


@pytest.mark.parametrize("peer", ["192.168.2.7:5000", "10.0.0.1:1", "[::1]:5000", "", "garbage"])
def test_any_other_peer_without_a_key_is_a_401(store, peer):
    with pytest.raises(ApiError) as refused:
        guard_of(store)(Request(peer), Route())
    assert refused.value.kind is ErrorKind.AUTHENTICATION


def test_inference_only_and_its_own_rate_limit(store):
    guard = guard_of(store, limit=3)
    with pytest.raises(ApiError) as refused:
        guard(Request("192.168.1.7:1"), Route(permissions.MODELS_MANAGE, "cluster"))
    assert refused.value.kind is ErrorKind.PERMISSION
    for _ in range(3):
        guard(Request("192.168.1.7:1"), Route())
    with pytest.raises(ApiError) as limited:
        guard(Request("192.168.1.8:1"), Route())              # shared by every such request
    assert limited.value.kind is ErrorKind.RATE_LIMIT


def test_a_key_sent_from_a_listed_network_is_the_keys(store):
    record, key = store.create("app", frozenset({permissions.INFERENCE}))
    request = Request("192.168.1.7:1", b"Bearer " + key.encode())
    guard_of(store)(request, Route())
    assert request.key.id == record.id
    with pytest.raises(ApiError) as wrong:
        guard_of(store)(Request("192.168.1.7:1", b"Bearer sk-wrong"), Route())
    assert wrong.value.kind is ErrorKind.AUTHENTICATION


def test_networks_are_checked():
    assert address_of("[::1]:80") is not None and address_of("nope:1") is None
    with pytest.raises(ValueError, match="lan"):
        parse_networks(["lan"])
