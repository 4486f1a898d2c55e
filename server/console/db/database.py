"""Open the console's database and bring its schema up to date.

SQLite is the default (a file in the data dir: WAL, so readers never wait for the writer;
foreign keys on; a busy timeout instead of "database is locked"). PostgreSQL when
`console.database_url` says so. Both through SQLAlchemy's asyncio engine, so no query
blocks the event loop (aiosqlite runs SQLite on its own thread, asyncpg is asynchronous).
"""
from __future__ import annotations

import os

from alembic import command
from alembic.config import Config
from sqlalchemy import Table, event, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..errors import Code, Refused
from .schema import metadata

MIGRATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "migrations")


def resolve_url(url: str, data_dir: str) -> str:
    """'' -> SQLite in the data dir; plain sqlite:// and postgresql:// get their async driver."""
    if not url:
        return "sqlite+aiosqlite:///" + os.path.join(data_dir, "console.db")
    for plain, driver in (("sqlite://", "sqlite+aiosqlite://"),
                          ("postgresql://", "postgresql+asyncpg://"),
                          ("postgres://", "postgresql+asyncpg://")):
        if url.startswith(plain):
            return driver + url[len(plain):]
    return url


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def open_engine(url: str) -> AsyncEngine:
    engine = create_async_engine(url, pool_pre_ping=not url.startswith("sqlite"))
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _upgrade(connection) -> None:
    config = Config()
    config.set_main_option("script_location", MIGRATIONS)
    config.attributes["connection"] = connection
    config.attributes["metadata"] = metadata
    command.upgrade(config, "head")


async def migrate(engine: AsyncEngine) -> None:
    """Apply every migration not applied yet (Alembic, on a connection of our engine)."""
    async with engine.begin() as connection:
        await connection.run_sync(_upgrade)


async def row_by_id(engine: AsyncEngine, table: Table, row_id: str, noun: str):
    """The row of `table` with that id; a refusal naming the `noun` when there is none."""
    async with engine.connect() as conn:
        row = (await conn.execute(select(table).where(table.c.id == row_id))).first()
    if row is None:
        raise Refused(Code.NOT_FOUND, f"no {noun} with id {row_id!r}")
    return row
