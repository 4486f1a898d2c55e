"""What the console's domain code refuses, and the one table that maps it to the HTTP taxonomy.

Accounts, devices and tokens raise `Refused(Code.X, message)`; only the routes' wrapper turns
it into an ApiError, so nothing below the routes knows about HTTP statuses.
"""
from __future__ import annotations

import enum

from ..auth.key_auth import CHALLENGE
from ..http.errors import ApiError, ErrorKind


class Code(enum.Enum):
    INVALID = "invalid"                   # a field's value is wrong
    UNAUTHENTICATED = "unauthenticated"   # bad credentials or token
    FORBIDDEN = "forbidden"               # a rejected account
    NOT_FOUND = "not_found"
    TAKEN = "taken"                       # a name already in use
    STATE = "state"                       # a transition the current state forbids
    UNAVAILABLE = "unavailable"           # a device or the coordinator does not answer


class Refused(Exception):
    def __init__(self, code: Code, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


_KINDS = {
    Code.INVALID: ErrorKind.INVALID_REQUEST,
    Code.UNAUTHENTICATED: ErrorKind.AUTHENTICATION,
    Code.FORBIDDEN: ErrorKind.PERMISSION,
    Code.NOT_FOUND: ErrorKind.NOT_FOUND,
    Code.TAKEN: ErrorKind.CONFLICT,
    Code.STATE: ErrorKind.STATE_CONFLICT,
    Code.UNAVAILABLE: ErrorKind.UNAVAILABLE,
}


def to_api_error(refused: Refused) -> ApiError:
    headers = CHALLENGE if refused.code is Code.UNAUTHENTICATED else ()
    if refused.code is Code.UNAVAILABLE:
        headers = ((b"retry-after", b"5"),)
    return ApiError(_KINDS[refused.code], refused.message, param=refused.param, headers=headers)
