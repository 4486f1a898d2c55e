"""Who is calling: the one shape every authenticator produces.

The guard only ever sees a Principal, whatever the credential was: a node API key, a
console access token, or (later) the cluster secret. Permissions are a set of names; a
console level is expanded into the permissions of every level at or below it
(`levels.allowed`), the way the node's `admin` permission expands into every other.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    kind: str                          # "key" (node API key), "user" (console account)
    id: str                            # stable id: the key's or the account's
    name: str                          # what the access log shows: key name, username
    allowed: frozenset[str]            # permissions, expanded
    level: str | None = None           # console level, for a user
    devices: frozenset[str] | None = None   # device scope; None: every device
    expires: float | None = None       # epoch seconds the credential stops being valid


class Authenticator:
    """Turns the token of `Authorization: Bearer <token>` into a Principal.

    `versioned.generation` changes whenever what a token resolves to may have changed (a key
    revoked, a level changed): per-connection caches are keyed by it."""

    versioned: object
    missing_message: str = "missing credentials: send 'Authorization: Bearer <token>'"
    malformed_message: str = "malformed Authorization header: expected 'Bearer <token>'"

    def authenticate(self, token: bytes) -> Principal:
        """Returns the principal or raises ApiError(AUTHENTICATION / PERMISSION)."""
        raise NotImplementedError

    def refusal(self, principal: Principal, permission: str) -> str:
        return f"this credential lacks the '{permission}' permission"
