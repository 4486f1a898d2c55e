"""Verify a console-signed JWT: one pinned algorithm (EdDSA over Ed25519), every claim required.

Shared by the console (access tokens) and the node (terminal tokens, against the public
keys `pair` stored), so both refuse the same forgeries: another `alg` (none, HS256 keyed with
the public key), an unknown `kid`, a `crit` header (we implement no extension), a missing or
wrong `iss`/`aud`, `exp` past, `nbf` or `iat` in the future, a tampered payload.
"""
from __future__ import annotations

import base64

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

ALGORITHM = "EdDSA"
REQUIRED = ["iss", "aud", "exp", "iat", "nbf", "jti", "sub"]
LEEWAY = 5          # seconds of clock skew tolerated between console and node


class TokenError(Exception):
    """Why a token was refused; the message is safe to show the caller."""


def public_key_from_jwk(jwk: dict) -> Ed25519PublicKey:
    if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519" or not isinstance(jwk.get("x"), str):
        raise TokenError("not an Ed25519 JWK")
    raw = base64.urlsafe_b64decode(jwk["x"] + "=" * (-len(jwk["x"]) % 4))
    return Ed25519PublicKey.from_public_bytes(raw)


def keys_from_jwks(jwks: dict) -> dict[str, Ed25519PublicKey]:
    return {jwk["kid"]: public_key_from_jwk(jwk) for jwk in jwks.get("keys", []) if "kid" in jwk}


def verify(token: str | bytes, keys: dict[str, Ed25519PublicKey], *, audience: str,
           issuer: str) -> dict:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise TokenError("malformed token") from None
    if header.get("alg") != ALGORITHM:
        raise TokenError(f"token algorithm must be {ALGORITHM}")
    if "crit" in header:
        raise TokenError("token has critical header parameters this service does not implement")
    key = keys.get(header.get("kid"))
    if key is None:
        raise TokenError("token signed with an unknown key (kid)")
    try:
        return jwt.decode(token, key, algorithms=[ALGORITHM], audience=audience, issuer=issuer,
                          leeway=LEEWAY, options={"require": REQUIRED, "verify_iat": True})
    except jwt.ExpiredSignatureError:
        raise TokenError("token has expired") from None
    except jwt.ImmatureSignatureError:
        raise TokenError("token is not valid yet") from None
    except jwt.InvalidAudienceError:
        raise TokenError("token is for another audience") from None
    except jwt.InvalidIssuerError:
        raise TokenError("token has the wrong issuer") from None
    except jwt.MissingRequiredClaimError as exc:
        raise TokenError(f"token lacks the '{exc.claim}' claim") from None
    except jwt.PyJWTError:
        raise TokenError("invalid token") from None
