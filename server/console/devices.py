"""Device records, pairing tokens and enrolment.

A device record holds the two addresses of a node (inference and cluster) and the node API
key the console uses to reach it, sealed by the vault; the key is never returned. Pairing
tokens are random, shown once, stored as digests, single use and expiring: a node presents
one (`stackd pair`) to enrol itself.
"""
from __future__ import annotations

import re
import secrets
import time
from urllib.parse import urlsplit

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from .accounts import digest, new_id
from .db.database import row_by_id
from .db.schema import devices, pairing_tokens
from .errors import Code, Refused
from .vault import Vault

NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
PAIRING_TTL = 15 * 60
PAIRING_TTL_RANGE = (60, 7 * 24 * 3600)
ONLINE, OFFLINE, UNKNOWN = "online", "offline", "unknown"


def check_url(value: str, field: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username \
            or parts.password or parts.query or parts.fragment or parts.path not in ("", "/"):
        raise Refused(Code.INVALID, f"'{field}' must be an http(s) base URL such as "
                      "http://10.0.0.5:8080, without a path, credentials or query", field)
    try:
        parts.port
    except ValueError:
        raise Refused(Code.INVALID, f"'{field}' has an invalid port", field) from None
    return value.rstrip("/")


def check_device(name: str, inference_url: str, cluster_url: str) -> tuple[str, str, str]:
    if not NAME.fullmatch(name):
        raise Refused(Code.INVALID, "'name' must be 1-64 characters of letters, digits, '.', "
                      "'_' or '-'", "name")
    return name, check_url(inference_url, "inference_url"), check_url(cluster_url, "cluster_url")


def record(row) -> dict:
    return {"id": row.id, "name": row.name, "inference_url": row.inference_url,
            "cluster_url": row.cluster_url, "status": row.status, "last_seen_at": row.last_seen_at,
            "created_by": row.created_by, "created_at": row.created_at}


class Devices:
    def __init__(self, engine: AsyncEngine, vault: Vault):
        self.engine = engine
        self.vault = vault

    async def listing(self) -> list[dict]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(devices).order_by(devices.c.created_at, devices.c.name))
            return [record(row) for row in rows]

    async def get(self, device_id: str):
        return await row_by_id(self.engine, devices, device_id, "device")

    def api_key(self, row) -> str:
        return self.vault.open(row.id, row.api_key_sealed)

    async def create(self, name: str, inference_url: str, cluster_url: str, api_key: str,
                     created_by: str, conn=None) -> dict:
        name, inference_url, cluster_url = check_device(name, inference_url, cluster_url)
        device_id = new_id("dev_")
        values = {"id": device_id, "name": name, "inference_url": inference_url,
                  "cluster_url": cluster_url, "api_key_sealed": self.vault.seal(device_id, api_key),
                  "status": UNKNOWN, "created_by": created_by, "created_at": int(time.time())}
        try:
            if conn is None:
                async with self.engine.begin() as own:
                    await own.execute(insert(devices).values(**values))
            else:                   # inside the caller's transaction: a failure rolls it all back
                await conn.execute(insert(devices).values(**values))
        except IntegrityError:
            raise Refused(Code.TAKEN, f"a device named {name!r} exists already", "name") from None
        values["last_seen_at"] = None
        return {k: values[k] for k in ("id", "name", "inference_url", "cluster_url", "status",
                                       "last_seen_at", "created_by", "created_at")}

    async def update(self, device_id: str, inference_url: str, cluster_url: str,
                     api_key: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(update(devices).where(devices.c.id == device_id).values(
                inference_url=check_url(inference_url, "inference_url"),
                cluster_url=check_url(cluster_url, "cluster_url"),
                api_key_sealed=self.vault.seal(device_id, api_key)))

    async def set_status(self, device_id: str, online: bool) -> None:
        values = {"status": ONLINE, "last_seen_at": int(time.time())} if online else {"status": OFFLINE}
        async with self.engine.begin() as conn:
            await conn.execute(update(devices).where(devices.c.id == device_id).values(**values))

    # ---- pairing --------------------------------------------------------------------------------

    async def issue_pairing_token(self, created_by: str, ttl: int) -> dict:
        token = "pt_" + secrets.token_urlsafe(32)
        now = int(time.time())
        async with self.engine.begin() as conn:
            await conn.execute(insert(pairing_tokens).values(
                id=new_id("pair_"), digest=digest(token), created_by=created_by, created_at=now,
                expires_at=now + ttl))
        return {"token": token, "expires_at": now + ttl}

    async def enroll(self, token: str, name: str, inference_url: str, cluster_url: str,
                     api_key: str) -> dict:
        check_device(name, inference_url, cluster_url)
        now = int(time.time())
        async with self.engine.begin() as conn:
            pairing = (await conn.execute(select(pairing_tokens).where(
                pairing_tokens.c.digest == digest(token)))).first()
            if pairing is None:
                raise Refused(Code.UNAUTHENTICATED, "unknown pairing token")
            if pairing.used_at is not None:
                raise Refused(Code.UNAUTHENTICATED, "this pairing token was used already: "
                              "ask an admin for a new one")
            if pairing.expires_at <= now:
                raise Refused(Code.UNAUTHENTICATED, "this pairing token has expired: ask an admin "
                              "for a new one")
            # the conditional update makes the token single use even under racing enrolments
            taken = await conn.execute(update(pairing_tokens).where(
                pairing_tokens.c.id == pairing.id, pairing_tokens.c.used_at.is_(None)
            ).values(used_at=now))
            if taken.rowcount != 1:
                raise Refused(Code.UNAUTHENTICATED, "this pairing token was used already")
            device = await self.create(name, inference_url, cluster_url, api_key,
                                       pairing.created_by, conn)
            await conn.execute(update(pairing_tokens).where(pairing_tokens.c.id == pairing.id)
                               .values(device_id=device["id"]))
        return device
