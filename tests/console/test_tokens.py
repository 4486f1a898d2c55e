"""Access tokens under attack, and refresh tokens: rotation, reuse, logout, rejection."""
from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid

import jwt
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from stackd.console.signing import ISSUER

pytestmark = pytest.mark.slow


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def claims(harness, **override) -> dict:
    now = int(time.time())
    admin = next(a for a in harness.console.directory.accounts.values() if a.username == "admin")
    out = {"iss": ISSUER, "aud": "stackd-console", "sub": admin.id, "iat": now, "nbf": now,
           "exp": now + 600, "jti": uuid.uuid4().hex}
    out.update(override)
    return {k: v for k, v in out.items() if v is not None}


def signed(harness, payload: dict, headers: dict | None = None) -> str:
    keys = harness.console.keys
    return jwt.encode(payload, keys.private[keys.current], algorithm="EdDSA",
                      headers={"kid": keys.current, **(headers or {})})


def unsigned(header: dict, payload: dict, signature: bytes = b"") -> str:
    return ".".join([b64(orjson.dumps(header)), b64(orjson.dumps(payload)), b64(signature)])


def hs256_with_public_key(harness, payload: dict) -> str:
    keys = harness.console.keys
    public_pem = keys.public[keys.current].public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    header = {"alg": "HS256", "typ": "JWT", "kid": keys.current}
    signing_input = f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(payload))}"
    mac = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


def tampered(harness) -> str:
    head, payload, signature = signed(harness, claims(harness)).split(".")
    body = orjson.loads(base64.urlsafe_b64decode(payload + "=="))
    body["sub"] = "usr_someone_else"
    return ".".join([head, b64(orjson.dumps(body)), signature])


def foreign_key(harness) -> str:
    other = Ed25519PrivateKey.generate()
    return jwt.encode(claims(harness), other, algorithm="EdDSA",
                      headers={"kid": harness.console.keys.current})


ATTACKS = {
    "alg none": lambda h: unsigned({"alg": "none", "typ": "JWT"}, claims(h)),
    "alg none with kid": lambda h: unsigned({"alg": "none", "kid": h.console.keys.current}, claims(h)),
    "HS256 keyed with the public key": lambda h: hs256_with_public_key(h, claims(h)),
    "expired": lambda h: signed(h, claims(h, iat=int(time.time()) - 3600,
                                         nbf=int(time.time()) - 3600, exp=int(time.time()) - 60)),
    "future nbf": lambda h: signed(h, claims(h, nbf=int(time.time()) + 600)),
    "wrong aud": lambda h: signed(h, claims(h, aud="terminal")),
    "wrong iss": lambda h: signed(h, claims(h, iss="someone-else")),
    "missing exp": lambda h: signed(h, claims(h, exp=None)),
    "missing jti": lambda h: signed(h, claims(h, jti=None)),
    "tampered payload": tampered,
    "unknown kid": lambda h: signed(h, claims(h), {"kid": "not-a-kid"}),
    "signed by another key": foreign_key,
    "unknown crit": lambda h: signed(h, claims(h), {"crit": ["exp-ext"], "exp-ext": 1}),
    "garbage": lambda h: "not.a.jwt",
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_forged_access_tokens_are_refused(shared, attack):
    status, headers, body = shared.call("GET", "/api/me", ATTACKS[attack](shared))
    assert status == 401, body
    assert body["error"]["type"] == "authentication_error"
    assert body["error"]["message"].startswith("invalid access token")
    assert "www-authenticate" in headers


def test_a_genuine_token_passes_the_same_checks(shared):
    status, _, body = shared.call("GET", "/api/me", signed(shared, claims(shared)))
    assert status == 200 and body["username"] == "admin"


def test_an_expired_token_stops_working_on_a_keep_alive_connection(shared):
    """The per-connection cache must not outlive the token's exp (a guard matter: one backend)."""
    if shared.database_url:
        pytest.skip("the guard's cache does not depend on the database: run on SQLite only")
    token = signed(shared, claims(shared, exp=int(time.time()) + 1))
    conn = shared.connect()
    assert shared.call("GET", "/api/me", token, conn=conn)[0] == 200
    time.sleep(1 + 5 + 1.1)      # exp, the 5 s leeway, and a second of margin
    status, _, body = shared.call("GET", "/api/me", token, conn=conn)
    assert status == 401 and "expired" in body["error"]["message"]
    conn.close()


def test_jwks_publishes_the_verifying_key(shared):
    token = shared.admin_token()
    status, _, jwks = shared.call("GET", "/api/auth/jwks")
    assert status == 200
    [key] = jwks["keys"]
    assert key["kty"] == "OKP" and key["crv"] == "Ed25519" and key["alg"] == "EdDSA"
    public = jwt.PyJWK(key).key
    decoded = jwt.decode(token, public, algorithms=["EdDSA"], audience="stackd-console",
                         issuer=ISSUER)
    assert decoded["exp"] - decoded["iat"] == 15 * 60


def test_refresh_rotates_and_reuse_revokes_the_family(shared):
    shared.add_user("rotating", "viewer")
    first = shared.login("rotating", "password-123")
    status, _, second = shared.call("POST", "/api/auth/refresh",
                                    body={"refresh_token": first["refresh_token"]})
    assert status == 200 and second["refresh_token"] != first["refresh_token"]
    assert second["token_type"] == "bearer" and second["expires_in"] == 900
    assert shared.call("GET", "/api/devices", second["access_token"])[0] == 200
    # the first token again: theft. It fails, and so does the legitimate newer one.
    status, _, body = shared.call("POST", "/api/auth/refresh",
                                  body={"refresh_token": first["refresh_token"]})
    assert status == 401 and "already used" in body["error"]["message"]
    status, _, body = shared.call("POST", "/api/auth/refresh",
                                  body={"refresh_token": second["refresh_token"]})
    assert status == 401 and "revoked" in body["error"]["message"]
    # another login is another family, untouched
    third = shared.login("rotating", "password-123")
    assert shared.call("POST", "/api/auth/refresh",
                       body={"refresh_token": third["refresh_token"]})[0] == 200


def test_logout_revokes_the_refresh_token(shared):
    shared.add_user("leaving", "viewer")
    tokens = shared.login("leaving", "password-123")
    assert shared.call("POST", "/api/auth/logout",
                       body={"refresh_token": tokens["refresh_token"]}) [0] == 200
    status, _, body = shared.call("POST", "/api/auth/refresh",
                                  body={"refresh_token": tokens["refresh_token"]})
    assert status == 401 and "revoked" in body["error"]["message"]


def test_unknown_refresh_token(shared):
    status, _, body = shared.call("POST", "/api/auth/refresh", body={"refresh_token": "rt_nope"})
    assert status == 401 and body["error"]["message"] == "unknown refresh token"


def test_a_rejected_user_cannot_refresh(shared):
    profile = shared.add_user("soon-rejected", "viewer")
    tokens = shared.login("soon-rejected", "password-123")
    shared.call("POST", f"/api/admin/users/{profile['id']}/reject", shared.admin_token(),
                {"reason": "left the company"})
    status, _, body = shared.call("POST", "/api/auth/refresh",
                                  body={"refresh_token": tokens["refresh_token"]})
    assert status == 403 and "left the company" in body["error"]["message"]
