"""The daemon's and the console's log on stderr: our own loggers (`stackd.*`) at the configured
level; libraries' (alembic, httpx2, asyncio, ...) at WARNING unless the level is `debug`, so an
ordinary start prints what a user needs and nothing of how a library went about it."""
from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
OURS = "stackd"


def configure(level: str) -> None:
    """`level`: debug, info, warning or error (the `log_level` setting)."""
    ours = getattr(logging, level.upper())
    libraries = logging.DEBUG if ours == logging.DEBUG else max(ours, logging.WARNING)
    logging.basicConfig(level=libraries, format=FORMAT)
    logging.getLogger(OURS).setLevel(ours)
