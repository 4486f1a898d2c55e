"""Files only this user may read, written so that a crash never leaves half of one."""
from __future__ import annotations

import contextlib
import os
import secrets


def write_private_file(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically with mode 0600 (temp file, fsync, rename)."""
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
