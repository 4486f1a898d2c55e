"""Request signing: what is covered by the signature, the replay window's edges, the nonce cache."""
from __future__ import annotations

import pytest

from stackd.cluster import signing
from stackd.cluster.signing import REPLAY_WINDOW, ReplayCache, SignatureError

SECRET = b"0123456789abcdef0123456789abcdef"
NOW = 1_800_000_000.0


def _signed(**changes):
    request = {"method": "POST", "path": "/internal/v1/heartbeat", "body": b'{"a":1}'}
    headers = signing.sign(SECRET, request["method"], request["path"], request["body"], NOW, node_id="n1")
    request.update(changes)
    return request, headers


def test_a_signed_request_verifies_and_names_its_sender():
    request, headers = _signed()
    signed = signing.verify(SECRET, request["method"], request["path"], request["body"], headers, NOW)
    assert signed["node"] == "n1" and signed["timestamp"] == NOW


@pytest.mark.parametrize("change", [{"method": "GET"}, {"path": "/internal/v1/leave"},
                                    {"body": b'{"a":2}'}, {"body": b""}])
def test_method_path_and_body_are_signed(change):
    request, headers = _signed(**change)
    with pytest.raises(SignatureError, match="bad cluster signature"):
        signing.verify(SECRET, request["method"], request["path"], request["body"], headers, NOW)


@pytest.mark.parametrize("header", [signing.NODE, signing.TIMESTAMP, signing.NONCE])
def test_every_signed_header_is_covered(header):
    request, headers = _signed()
    original = headers[header]
    headers[header] = str(int(original) + 1) if header == signing.TIMESTAMP else (
        "f" * len(original) if header == signing.NONCE else "n2")
    with pytest.raises(SignatureError):
        signing.verify(SECRET, request["method"], request["path"], request["body"], headers, NOW)


def test_another_secret_is_refused():
    request, headers = _signed()
    with pytest.raises(SignatureError, match="bad"):
        signing.verify(b"x" * 32, request["method"], request["path"], request["body"], headers, NOW)


@pytest.mark.parametrize("missing", [signing.SIGNATURE, signing.TIMESTAMP, signing.NONCE])
def test_missing_headers_are_refused(missing):
    request, headers = _signed()
    del headers[missing]
    with pytest.raises(SignatureError, match="missing"):
        signing.verify(SECRET, request["method"], request["path"], request["body"], headers, NOW)


@pytest.mark.parametrize("skew,accepted", [(0, True), (REPLAY_WINDOW, True), (-REPLAY_WINDOW, True),
                                           (REPLAY_WINDOW + 0.01, False), (-REPLAY_WINDOW - 0.01, False)])
def test_the_replay_window_edges(skew, accepted):
    request, headers = _signed()
    verify = lambda: signing.verify(SECRET, request["method"], request["path"], request["body"],  # noqa: E731
                                    headers, NOW + skew)
    if accepted:
        verify()
    else:
        with pytest.raises(SignatureError, match="stale"):
            verify()


def test_headers_may_be_bytes_as_the_http_layer_gives_them():
    request, headers = _signed()
    raw = {k.encode(): v.encode() for k, v in headers.items()}
    signing.verify(SECRET, request["method"], request["path"], request["body"], raw, NOW)


def test_a_nonce_is_accepted_once_and_forgotten_after_the_window():
    cache = ReplayCache(limit=3)
    cache.admit("a" * 32, NOW, now=NOW)
    with pytest.raises(SignatureError, match="replayed"):
        cache.admit("a" * 32, NOW, now=NOW + 1)
    cache.admit("a" * 32, NOW + 10, now=NOW + REPLAY_WINDOW + 0.1)   # the first one expired
    cache.admit("b" * 32, NOW + 10, now=NOW + 10)
    cache.admit("c" * 32, NOW + 10, now=NOW + 10)
    with pytest.raises(SignatureError, match="too many"):
        cache.admit("d" * 32, NOW + 10, now=NOW + 10)


def test_answers_are_bound_to_the_request_nonce_status_and_body():
    mac = signing.sign_answer(SECRET, "n" * 32, 200, b"{}")
    assert signing.verify_answer(SECRET, "n" * 32, 200, b"{}", mac)
    assert not signing.verify_answer(SECRET, "m" * 32, 200, b"{}", mac)
    assert not signing.verify_answer(SECRET, "n" * 32, 201, b"{}", mac)
    assert not signing.verify_answer(SECRET, "n" * 32, 200, b"[]", mac)
    assert not signing.verify_answer(SECRET, "n" * 32, 200, b"{}", None)
