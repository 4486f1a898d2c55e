"""The console's signing keys: Ed25519 pairs in DATA_DIR/console-jwt/<kid>.pem (0600).

Generated on first start. The newest key signs; every key in the folder verifies and is
published in the JWKS, so a key can be rotated by adding a new one (`rotate`) and removing the
old one once the tokens it signed have expired.
"""
from __future__ import annotations

import base64
import hashlib
import os
import time
import uuid

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..auth import jwt_verify
from ..system.files import write_private_file

ISSUER = "stackd-console"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _raw_public(private: Ed25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(serialization.Encoding.Raw,
                                             serialization.PublicFormat.Raw)


def kid_of(private: Ed25519PrivateKey) -> str:
    """The key id: a digest of the public key, so it never collides across rotations."""
    return _b64(hashlib.sha256(_raw_public(private)).digest()[:12])


class SigningKeys:
    def __init__(self, data_dir: str):
        self.folder = os.path.join(data_dir, "console-jwt")
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        self.private: dict[str, Ed25519PrivateKey] = {}
        self.current = ""
        self.load()
        if not self.private:
            self.rotate()

    def load(self) -> None:
        found = []
        for name in os.listdir(self.folder):
            if name.endswith(".pem"):
                path = os.path.join(self.folder, name)
                with open(path, "rb") as f:
                    key = serialization.load_pem_private_key(f.read(), password=None)
                found.append((os.stat(path).st_mtime_ns, kid_of(key), key))
        found.sort(key=lambda item: item[0])
        self.private = {kid: key for _, kid, key in found}
        self.current = found[-1][1] if found else ""
        self.public = {kid: key.public_key() for kid, key in self.private.items()}

    def rotate(self) -> str:
        key = Ed25519PrivateKey.generate()
        kid = kid_of(key)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        write_private_file(os.path.join(self.folder, kid + ".pem"), pem)
        self.load()
        return kid

    def jwks(self) -> dict:
        return {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": _b64(_raw_public(key)), "kid": kid,
                          "use": "sig", "alg": jwt_verify.ALGORITHM}
                         for kid, key in self.private.items()]}

    def sign(self, subject: str, audience: str, ttl: int, **claims) -> tuple[str, int]:
        """-> (token, exp). Every token carries iss, aud, sub, iat, nbf, exp and a unique jti."""
        now = int(time.time())
        payload = {"iss": ISSUER, "aud": audience, "sub": subject, "iat": now, "nbf": now,
                   "exp": now + ttl, "jti": uuid.uuid4().hex, **claims}
        token = jwt.encode(payload, self.private[self.current], algorithm=jwt_verify.ALGORITHM,
                           headers={"kid": self.current})
        return token, now + ttl

    def verify(self, token: str | bytes, audience: str) -> dict:
        return jwt_verify.verify(token, self.public, audience=audience, issuer=ISSUER)
