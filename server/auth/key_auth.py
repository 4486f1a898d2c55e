"""Node API keys as an authenticator: the key's digest looked up in the key store."""
from __future__ import annotations

from ..http.errors import ApiError, ErrorKind
from .keys import KeyRecord, KeyStore
from .principal import Authenticator, Principal

CHALLENGE = ((b"www-authenticate", b'Bearer realm="stackd"'),)


def unauthenticated(message: str) -> ApiError:
    return ApiError(ErrorKind.AUTHENTICATION, message, headers=CHALLENGE)


def principal_of(record: KeyRecord) -> Principal:
    return Principal("key", record.id, record.name, record.allowed)


class KeyAuthenticator(Authenticator):
    missing_message = "missing API key: send 'Authorization: Bearer <key>'"
    malformed_message = "malformed Authorization header: expected 'Bearer <key>'"

    def __init__(self, keys: KeyStore):
        self.keys = keys
        self.versioned = keys            # KeyStore.generation is bumped on every reload

    def authenticate(self, token: bytes) -> Principal:
        record = self.keys.lookup(token)
        if record is None:
            raise unauthenticated("invalid API key")
        return principal_of(record)

    def refusal(self, principal: Principal, permission: str) -> str:
        return f"this API key lacks the '{permission}' permission"
