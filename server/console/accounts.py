"""Accounts: sign-up, login, refresh-token rotation, approval and rejection.

States: pending -> approved (with a level) | rejected (with an optional reason); an admin may
re-approve a rejected account or change a level. Nobody decides about themselves, and the
last admin cannot be demoted or rejected.

Refresh tokens are opaque, stored as SHA-256 digests, single use: each use marks the token
used and issues the next one of its family. A used token presented again means it was
copied: the whole family (every session of that login) is revoked.
"""
from __future__ import annotations

import hashlib
import re
import secrets
import time

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from ..auth import levels
from .db.database import row_by_id
from .db.schema import refresh_tokens, users
from .directory import APPROVED, PENDING, REJECTED, Account, Directory
from .errors import Code, Refused
from .passwords import MAX_LENGTH, MIN_LENGTH, hash_off_loop, verify_off_loop
from .signing import SigningKeys

USERNAME = re.compile(r"[A-Za-z0-9._-]{3,64}")
ACCESS_TTL = 15 * 60
MAX_REASON = 500
LOGIN_FAILED = "invalid username or password"


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(8)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def profile(row) -> dict:
    account = Account.from_row(row)
    out = {"id": row.id, "username": row.username, "state": row.state,
           "level": account.effective_level, "created_at": row.created_at}
    if row.state == APPROVED:
        out["granted_level"] = row.level
    if row.state == REJECTED:
        out["reason"] = row.reason
    if row.decided_at is not None:
        out["decided_at"], out["decided_by"] = row.decided_at, row.decided_by
    return out


def check_credentials(username: str, password: str) -> None:
    if not USERNAME.fullmatch(username):
        raise Refused(Code.INVALID, "'username' must be 3-64 characters of letters, digits, "
                      "'.', '_' or '-'", "username")
    if not MIN_LENGTH <= len(password) <= MAX_LENGTH:
        raise Refused(Code.INVALID, f"'password' must be {MIN_LENGTH}-{MAX_LENGTH} characters",
                      "password")


class Accounts:
    def __init__(self, engine: AsyncEngine, keys: SigningKeys, directory: Directory,
                 refresh_ttl: int):
        self.engine = engine
        self.keys = keys
        self.directory = directory
        self.refresh_ttl = refresh_ttl

    # ---- reading ------------------------------------------------------------------------------

    async def row(self, user_id: str):
        return await row_by_id(self.engine, users, user_id, "user")

    async def listing(self, state: str | None) -> list[dict]:
        query = select(users).order_by(users.c.created_at, users.c.username)
        if state is not None:
            query = query.where(users.c.state == state)
        async with self.engine.connect() as conn:
            return [profile(row) for row in await conn.execute(query)]

    async def reload_directory(self) -> None:
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(users.c.id, users.c.username, users.c.state,
                                             users.c.level, users.c.reason))
            self.directory.replace_all([Account.from_row(row) for row in rows])

    async def count(self) -> int:
        async with self.engine.connect() as conn:
            return (await conn.execute(select(func.count()).select_from(users))).scalar_one()

    # ---- sign-up and administrators -------------------------------------------------------------

    async def signup(self, username: str, password: str) -> dict:
        check_credentials(username, password)
        return await self._insert(username, await hash_off_loop(password), PENDING, None)

    async def _insert(self, username: str, password_hash: str, state: str, level: str | None):
        values = {"id": new_id("usr_"), "username": username, "password_hash": password_hash,
                  "state": state, "level": level, "created_at": int(time.time())}
        try:
            async with self.engine.begin() as conn:
                await conn.execute(insert(users).values(**values))
        except IntegrityError:
            raise Refused(Code.TAKEN, f"the username {username!r} is taken", "username") from None
        row = await self.row(values["id"])
        self.directory.put(Account.from_row(row))
        return profile(row)

    async def put_admin(self, username: str, password: str) -> dict:
        """Create an approved admin, or make an existing account one with this password."""
        check_credentials(username, password)
        password_hash = await hash_off_loop(password)
        async with self.engine.begin() as conn:
            done = await conn.execute(update(users).where(users.c.username == username).values(
                password_hash=password_hash, state=APPROVED, level=levels.ADMIN, reason=None,
                decided_at=int(time.time()), decided_by="cli"))
        if done.rowcount == 0:
            return await self._insert(username, password_hash, APPROVED, levels.ADMIN)
        await self.reload_directory()
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(users).where(users.c.username == username))).one()
        return profile(row)

    # ---- login and tokens -----------------------------------------------------------------------

    async def login(self, username: str, password: str) -> dict:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(users).where(users.c.username == username))).first()
        # an unknown user costs one verification too, against a dummy hash: same time, same answer
        if not await verify_off_loop(row.password_hash if row else None, password):
            raise Refused(Code.UNAUTHENTICATED, LOGIN_FAILED)
        self.directory.put(Account.from_row(row))
        self._refuse_rejected(row)
        return await self._tokens(row.id, new_id("fam_"))

    @staticmethod
    def _refuse_rejected(row) -> None:
        if row.state == REJECTED:
            reason = f": {row.reason}" if row.reason else ""
            raise Refused(Code.FORBIDDEN, f"this account was rejected{reason}")

    async def _tokens(self, user_id: str, family: str, conn=None) -> dict:
        access, _ = self.keys.sign(user_id, "stackd-console", ACCESS_TTL)
        refresh = "rt_" + secrets.token_urlsafe(32)
        now = int(time.time())
        values = {"id": new_id("rtk_"), "user_id": user_id, "family": family,
                  "digest": digest(refresh), "created_at": now, "expires_at": now + self.refresh_ttl}
        if conn is None:
            async with self.engine.begin() as own:
                await own.execute(insert(refresh_tokens).values(**values))
        else:
            await conn.execute(insert(refresh_tokens).values(**values))
        return {"access_token": access, "refresh_token": refresh, "token_type": "bearer",
                "expires_in": ACCESS_TTL}

    async def refresh(self, token: str) -> dict:
        now = int(time.time())
        async with self.engine.begin() as conn:
            record = await self._refresh_record(conn, token)
            # the conditional update is the rotation: of two racing uses, exactly one wins
            used = await conn.execute(update(refresh_tokens).where(
                refresh_tokens.c.id == record.id, refresh_tokens.c.used_at.is_(None),
                refresh_tokens.c.revoked_at.is_(None)).values(used_at=now))
            reused = used.rowcount != 1
            if reused:
                await self._revoke_family(conn, record.family, now)
            else:
                user = (await conn.execute(select(users).where(users.c.id == record.user_id))).one()
                if user.state == REJECTED:
                    await self._revoke_family(conn, record.family, now)
                else:
                    return await self._tokens(user.id, record.family, conn)
        if reused:      # raised after the commit, so the revocation stays
            raise Refused(Code.UNAUTHENTICATED, "refresh token was already used: every session "
                          "of this login is revoked; log in again")
        self._refuse_rejected(user)

    async def _refresh_record(self, conn, token: str):
        record = (await conn.execute(select(refresh_tokens).where(
            refresh_tokens.c.digest == digest(token)))).first()
        if record is None:
            raise Refused(Code.UNAUTHENTICATED, "unknown refresh token")
        if record.revoked_at is not None:
            raise Refused(Code.UNAUTHENTICATED, "refresh token was revoked; log in again")
        if record.expires_at <= int(time.time()):
            raise Refused(Code.UNAUTHENTICATED, "refresh token has expired; log in again")
        return record

    @staticmethod
    async def _revoke_family(conn, family: str, now: int) -> None:
        await conn.execute(update(refresh_tokens).where(
            refresh_tokens.c.family == family, refresh_tokens.c.revoked_at.is_(None)
        ).values(revoked_at=now))

    async def logout(self, token: str) -> None:
        async with self.engine.begin() as conn:
            record = await self._refresh_record(conn, token)
            await self._revoke_family(conn, record.family, int(time.time()))

    # ---- decisions ------------------------------------------------------------------------------

    async def approve(self, admin, user_id: str, level: str) -> dict:
        if level not in levels.GRANTABLE:
            raise Refused(Code.INVALID, f"'level' must be one of {', '.join(levels.GRANTABLE)}",
                          "level")
        return await self._decide(admin, user_id, APPROVED, level, None)

    async def reject(self, admin, user_id: str, reason: str | None) -> dict:
        return await self._decide(admin, user_id, REJECTED, None, reason)

    async def _decide(self, admin, user_id: str, state: str, level: str | None,
                      reason: str | None) -> dict:
        if user_id == admin.id:
            raise Refused(Code.STATE, "you cannot approve, reject or change your own account: "
                          "ask another admin")
        async with self.engine.begin() as conn:
            target = (await conn.execute(select(users).where(users.c.id == user_id))).first()
            if target is None:
                raise Refused(Code.NOT_FOUND, f"no user with id {user_id!r}")
            if target.state == APPROVED and target.level == levels.ADMIN and level != levels.ADMIN:
                admins = (await conn.execute(select(func.count()).select_from(users).where(
                    users.c.state == APPROVED, users.c.level == levels.ADMIN))).scalar_one()
                if admins <= 1:
                    raise Refused(Code.STATE, "this is the last admin: approve another admin first")
            await conn.execute(update(users).where(users.c.id == user_id).values(
                state=state, level=level, reason=reason, decided_at=int(time.time()),
                decided_by=admin.name))
            row = (await conn.execute(select(users).where(users.c.id == user_id))).one()
        self.directory.put(Account.from_row(row))
        return profile(row)
