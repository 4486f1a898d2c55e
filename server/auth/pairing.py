"""The node's side of a console: enrolment (`stackd pair`) and what it leaves behind.

`pair` creates a node API key for the console (inference, cluster:read, models:manage),
sends this node's addresses and that key to the console with a pairing token
(`POST /api/devices/enroll`), and stores the console's answer in DATA_DIR/console.json
(0600): the device id the console gave this node, the issuer, and the console's public
keys (JWKS), against which the node verifies terminal tokens (`terminal.py`).
"""
from __future__ import annotations

import os
import socket
import sys

import orjson

from ..system.files import write_private_file
from . import permissions
from .keys import KeyStore

CONSOLE_KEY_NAME = "console"
CONSOLE_PERMISSIONS = frozenset({permissions.INFERENCE, permissions.CLUSTER_READ,
                                 permissions.MODELS_MANAGE})
PAIRING_FILE = "console.json"


def create_console_key(keys: KeyStore) -> str:
    """A fresh key for the console; an older one of the same name is revoked first."""
    if any(record.name == CONSOLE_KEY_NAME for record in keys.records()):
        keys.revoke(CONSOLE_KEY_NAME)
    _, key = keys.create(CONSOLE_KEY_NAME, CONSOLE_PERMISSIONS)
    return key


def ensure_console_key_file(keys: KeyStore, path: str) -> str:
    """The embedded console's key to its own node: created once, kept in a 0600 file."""
    if os.path.exists(path) and any(r.name == CONSOLE_KEY_NAME for r in keys.records()):
        with open(path) as f:
            key = f.read().strip()
        if keys.lookup(key.encode()) is not None:
            return key
    key = create_console_key(keys)
    write_private_file(path, (key + "\n").encode())
    return key


def local_url(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def load_pairing(data_dir: str) -> dict | None:
    try:
        with open(os.path.join(data_dir, PAIRING_FILE), "rb") as f:
            return orjson.loads(f.read())
    except FileNotFoundError:
        return None


def pair(console_url: str, token: str, data_dir: str, name: str, inference_url: str,
         cluster_url: str, timeout: float = 30.0) -> dict:
    import httpx2 as httpx

    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    keys = KeyStore(data_dir)
    key = create_console_key(keys)
    try:
        response = httpx.post(console_url.rstrip("/") + "/api/devices/enroll", timeout=timeout,
                              json={"token": token, "name": name, "inference_url": inference_url,
                                    "cluster_url": cluster_url, "api_key": key}, trust_env=False)
    except httpx.HTTPError as exc:
        keys.revoke(CONSOLE_KEY_NAME)
        raise RuntimeError(f"cannot reach the console at {console_url}: {exc}") from None
    answer = response.json() if response.headers.get("content-type", "").startswith(
        "application/json") else {}
    if response.status_code != 201:
        keys.revoke(CONSOLE_KEY_NAME)
        message = answer.get("error", {}).get("message", response.text[:200])
        raise RuntimeError(f"the console refused the enrolment ({response.status_code}): {message}")
    stored = {"console_url": console_url.rstrip("/"), "device_id": answer["id"],
              "name": answer["name"], "issuer": answer["issuer"], "jwks": answer["jwks"]}
    write_private_file(os.path.join(data_dir, PAIRING_FILE), orjson.dumps(stored, option=orjson.OPT_INDENT_2))
    return stored


def main(args, settings) -> int:
    host = settings["host"]
    try:
        stored = pair(args.console_url, args.token, settings.data_dir,
                      args.name or socket.gethostname().split(".")[0],
                      args.inference_url or local_url(host, settings["inference_port"]),
                      args.cluster_url or local_url(host, settings["cluster_port"]))
    except (RuntimeError, ValueError, KeyError) as exc:
        print(f"stackd: {exc}", file=sys.stderr)
        return 1
    print(f"paired with {stored['console_url']} as device {stored['device_id']} "
          f"({stored['name']}); console keys stored in {PAIRING_FILE}")
    return 0
