"""Password hashes: argon2id (argon2-cffi's defaults, RFC 9106's second recommended profile).

Hashing costs tens of milliseconds and 64 MiB on purpose, so it runs on a worker thread,
never on the event loop. An unknown username is checked against a dummy hash, so it
answers like a wrong password, in about the same time.
"""
from __future__ import annotations

import asyncio

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()
_DUMMY = _hasher.hash("not a password anyone has")

MIN_LENGTH = 8
MAX_LENGTH = 1024


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(stored: str | None, password: str) -> bool:
    try:
        return _hasher.verify(stored or _DUMMY, password) and stored is not None
    except (VerificationError, InvalidHashError):
        return False


async def hash_off_loop(password: str) -> str:
    return await asyncio.get_running_loop().run_in_executor(None, hash_password, password)


async def verify_off_loop(stored: str | None, password: str) -> bool:
    return await asyncio.get_running_loop().run_in_executor(None, verify_password, stored, password)
