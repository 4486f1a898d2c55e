"""Device API keys at rest: AES-256-GCM with a key kept in DATA_DIR/console-secret.key (0600).

The device id is the associated data, so a sealed key copied onto another record fails to
open. The database alone (a backup, a PostgreSQL dump) reveals no device key.
"""
from __future__ import annotations

import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..system.files import write_private_file

NONCE = 12


class Vault:
    def __init__(self, data_dir: str):
        path = os.path.join(data_dir, "console-secret.key")
        if not os.path.exists(path):
            write_private_file(path, AESGCM.generate_key(bit_length=256))
        with open(path, "rb") as f:
            self._aead = AESGCM(f.read())

    def seal(self, device_id: str, secret: str) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, secret.encode(), device_id.encode())

    def open(self, device_id: str, sealed: bytes) -> str:
        return self._aead.decrypt(sealed[:NONCE], sealed[NONCE:], device_id.encode()).decode()
