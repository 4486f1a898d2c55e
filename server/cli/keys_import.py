"""`stackd keys import --name NAME --permissions PERMS --key-file PATH [--replace]`.

An API key made elsewhere (a provisioning tool, a systemd credential, a secrets manager) into
the key store: only its SHA-256 is stored, as for `stackd keys create`. The key is the file's
content without surrounding whitespace (a trailing newline is fine).

* A key named NAME with the same key and permissions already: nothing changes (exit 0), so a
  service can import on every start.
* A key named NAME with another key or other permissions: refused (exit 1) unless --replace,
  which swaps that record for the new one (new id, the old key stops working).
* The same key under another name: refused (one key, one record).

Limits: the key is 16 to 4,096 characters of visible ASCII (what an Authorization header
carries; no spaces inside), the name as for `keys create`. Anything else is a one-line error
and exit 1 (a missing or unreadable file, an empty one, a bad name or permission).
"""
from __future__ import annotations

import os
import secrets
import sys
import time

MIN_KEY, MAX_KEY = 16, 4096


def add_command(key_commands, common) -> None:
    imported = key_commands.add_parser(
        "import", help="store the key in a file (its SHA-256) under a name; idempotent")
    common(imported)
    imported.add_argument("--name", required=True)
    imported.add_argument("--permissions", required=True,
                          help="comma-separated: inference, cluster:read, cluster:write, "
                               "models:manage, admin")
    imported.add_argument("--key-file", required=True, metavar="PATH",
                          help="file holding the key (a systemd credential, for instance)")
    imported.add_argument("--replace", action="store_true",
                          help="replace a key of that name that differs")


def read_key(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KEY + 64)
    except OSError as exc:
        raise ValueError(f"cannot read the key file {path}: {exc.strerror or exc}") from None
    key = raw.strip()
    if not key:
        raise ValueError(f"the key file {path} is empty")
    if len(key) > MAX_KEY:
        raise ValueError(f"the key in {path} is longer than {MAX_KEY} characters")
    if len(key) < MIN_KEY:
        raise ValueError(f"the key in {path} is {len(key)} characters; at least {MIN_KEY} are needed")
    if any(b < 0x21 or b > 0x7E for b in key):
        raise ValueError(f"the key in {path} must be visible ASCII characters only (no spaces "
                         "or control characters inside)")
    return key


def main(args, settings) -> int:
    from ..auth import permissions
    from ..auth.keys import NAME_PATTERN, KeyRecord, KeyStore, digest

    try:
        if not NAME_PATTERN.fullmatch(args.name):
            raise ValueError("key name must be 1-64 characters of letters, digits, '.', '_' or '-'")
        granted = permissions.parse(args.permissions)
        key = read_key(args.key_file)
        os.makedirs(settings.data_dir, mode=0o700, exist_ok=True)
        store = KeyStore(settings.data_dir)
        wanted = digest(key)
        # The store's file and lock, as KeyStore.create and revoke use them (a KeyStore method
        # for this would be the tidier home; server/auth is another owner's).
        with store._locked():
            records = store._read()
            same_key = [r for r in records if r.digest == wanted and r.name != args.name]
            if same_key:
                raise ValueError(f"this key is stored already, as {same_key[0].name!r}")
            named = [r for r in records if r.name == args.name]
            if named and named[0].digest == wanted and named[0].permissions == granted:
                print(f"key {named[0].id} ({args.name}) unchanged")
                return 0
            if named and not args.replace:
                raise ValueError(f"a different key named {args.name!r} exists already "
                                 "(--replace to replace it)")
            record = KeyRecord("key_" + secrets.token_hex(6), args.name, wanted, granted,
                               permissions.effective(granted), int(time.time()),
                               key[:8].decode("ascii"))
            store._write([r for r in records if r.name != args.name] + [record])
    except (ValueError, KeyError) as exc:
        print(f"stackd: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
    print(f"{'replaced' if named else 'imported'} key {record.id} ({record.name}) with "
          f"{', '.join(sorted(record.permissions))}")
    return 0
