"""API keys: the store holds only SHA-256 digests, a name and permissions per key.

The file (`DATA_DIR/keys.json`, mode 0600) is rewritten atomically under a lock,
so the CLI can create or revoke keys while the daemon runs; the daemon notices
the new file on its next sweep (within half a second) and swaps its table.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import secrets
import time
from dataclasses import dataclass

import orjson

from ..system.files import write_private_file
from . import permissions

KEY_PREFIX = "sk-"
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class KeyRecord:
    id: str
    name: str
    digest: bytes                     # sha256(key)
    permissions: frozenset[str]       # as granted
    allowed: frozenset[str]           # granted, with admin expanded
    created_at: int
    hint: str                         # first characters, to tell keys apart in listings

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "sha256": self.digest.hex(),
                "permissions": sorted(self.permissions), "created_at": self.created_at,
                "hint": self.hint}

    @classmethod
    def from_json(cls, raw: dict) -> "KeyRecord":
        granted = frozenset(raw["permissions"])
        return cls(raw["id"], raw["name"], bytes.fromhex(raw["sha256"]), granted,
                   permissions.effective(granted), int(raw["created_at"]), raw.get("hint", ""))


def digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class KeyStore:
    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, "keys.json")
        self._lock_path = self.path + ".lock"
        self._by_digest: dict[bytes, KeyRecord] = {}
        self._stamp = None
        self.generation = 0             # bumped on every reload; per-connection caches check it
        self.reload_if_changed()

    # ---- the daemon's side --------------------------------------------------------------------

    def lookup(self, key: bytes) -> KeyRecord | None:
        wanted = digest(key)
        record = self._by_digest.get(wanted)
        if record is not None and hmac.compare_digest(record.digest, wanted):
            return record
        return None

    def reload_if_changed(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return False
        self._by_digest = {record.digest: record for record in self._read()}
        self._stamp = stamp
        self.generation += 1
        return True

    def records(self) -> list[KeyRecord]:
        return sorted(self._read(), key=lambda r: (r.created_at, r.name))

    # ---- the administrator's side -------------------------------------------------------------

    def create(self, name: str, granted: frozenset[str]) -> tuple[KeyRecord, str]:
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError("key name must be 1-64 characters of letters, digits, '.', '_' or '-'")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        record = KeyRecord("key_" + secrets.token_hex(6), name, digest(key.encode()), granted,
                           permissions.effective(granted), int(time.time()), key[:8])
        with self._locked():
            records = self._read()
            if any(r.name == name for r in records):
                raise ValueError(f"a key named {name!r} exists already")
            self._write(records + [record])
        self.reload_if_changed()
        return record, key

    def revoke(self, name_or_id: str) -> KeyRecord:
        with self._locked():
            records = self._read()
            doomed = [r for r in records if name_or_id in (r.name, r.id)]
            if not doomed:
                raise KeyError(f"no key named {name_or_id!r}")
            self._write([r for r in records if r not in doomed])
        self.reload_if_changed()
        return doomed[0]

    def is_empty(self) -> bool:
        return not self._read()

    # ---- the file -----------------------------------------------------------------------------

    def _read(self) -> list[KeyRecord]:
        try:
            with open(self.path, "rb") as f:
                raw = orjson.loads(f.read())
        except FileNotFoundError:
            return []
        return [KeyRecord.from_json(item) for item in raw.get("keys", [])]

    def _write(self, records: list[KeyRecord]) -> None:
        data = orjson.dumps({"version": 1, "keys": [r.to_json() for r in records]},
                            option=orjson.OPT_INDENT_2)
        write_private_file(self.path, data)

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def bootstrap_admin_key(store: KeyStore, data_dir: str) -> str | None:
    """On first start with an empty store, mint an admin key into a 0600 file; returns its path."""
    if not store.is_empty():
        return None
    _, key = store.create("admin", frozenset({permissions.ADMIN}))
    path = os.path.join(data_dir, "admin.key")
    write_private_file(path, (key + "\n").encode())
    return path
