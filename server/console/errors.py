"""What the console's domain code refuses: a DomainError (server/errors.py) with its code.

Accounts, devices and tokens raise `Refused(Code.X, message)`; the one table in api/errors.py
turns it into an HTTP answer, so nothing below the routes knows about HTTP statuses.
"""
from __future__ import annotations

from ..errors import Code, DomainError

__all__ = ["Code", "Refused"]

UPSTREAM_RETRY = 5      # seconds: a device or the coordinator that did not answer


class Refused(DomainError):
    def __init__(self, code: Code, message: str, param: str | None = None):
        super().__init__(code, message, param=param,
                         retry_after=UPSTREAM_RETRY if code is Code.UNAVAILABLE else None)
