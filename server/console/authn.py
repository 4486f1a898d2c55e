"""Console access tokens as an authenticator: verify the JWT, then read the level now.

The token says who; the directory says what they may do at this moment (a token minted
before a rejection carries no power after it).
"""
from __future__ import annotations

from ..auth import levels
from ..auth.jwt_verify import LEEWAY, TokenError
from ..auth.key_auth import unauthenticated
from ..auth.principal import Authenticator, Principal
from .directory import PENDING, REJECTED, Directory
from .signing import SigningKeys

ACCESS_AUDIENCE = "stackd-console"


class ConsoleAuthenticator(Authenticator):
    missing_message = "missing access token: send 'Authorization: Bearer <access_token>'"
    malformed_message = "malformed Authorization header: expected 'Bearer <access_token>'"

    def __init__(self, keys: SigningKeys, directory: Directory):
        self.keys = keys
        self.directory = directory
        self.versioned = directory

    def authenticate(self, token: bytes) -> Principal:
        try:
            claims = self.keys.verify(token, ACCESS_AUDIENCE)
        except TokenError as exc:
            raise unauthenticated(f"invalid access token: {exc}") from None
        account = self.directory.get(claims["sub"])
        if account is None:
            raise unauthenticated("invalid access token: the account no longer exists")
        level = account.effective_level
        return Principal("user", account.id, account.username, levels.allowed(level), level=level,
                         expires=float(claims["exp"] + LEEWAY))

    def refusal(self, principal: Principal, permission: str) -> str:
        needed = levels.of_permission(permission)
        account = self.directory.get(principal.id)
        if account is not None and account.state == PENDING:
            return f"this endpoint needs level '{needed}': your account is waiting for approval"
        if account is not None and account.state == REJECTED:
            reason = f": {account.reason}" if account.reason else ""
            return f"this endpoint needs level '{needed}': your account was rejected{reason}"
        return f"this endpoint needs level '{needed}'; yours is '{principal.level}'"
