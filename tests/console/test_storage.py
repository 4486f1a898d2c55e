"""Storage: migrations match the schema, SQLite's pragmas, and a restart keeps everything."""
from __future__ import annotations

import asyncio
import os

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
import pytest
from sqlalchemy import text

from stackd.console.db.database import migrate, open_engine, resolve_url
from stackd.console.db.schema import metadata

pytestmark = pytest.mark.slow


def test_migrations_create_exactly_the_schema(shared):
    async def differences():
        async with shared.console.engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync), metadata))
    assert shared.run(differences()) == []


def test_migrating_twice_is_a_no_op(shared):
    shared.run(migrate(shared.console.engine))
    assert shared.call("GET", "/api/health")[0] == 200


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path):
    async def pragmas():
        engine = open_engine(resolve_url("", str(tmp_path)))
        await migrate(engine)
        async with engine.connect() as conn:
            mode = (await conn.execute(text("PRAGMA journal_mode"))).scalar_one()
            keys = (await conn.execute(text("PRAGMA foreign_keys"))).scalar_one()
        await engine.dispose()
        return mode, keys
    assert asyncio.run(pragmas()) == ("wal", 1)
    assert os.path.exists(tmp_path / "console.db")


def test_restart_keeps_accounts_devices_tokens_and_keys(fresh):
    harness = fresh()
    admin_password = harness.admin_password
    harness.add_user("survivor", "operator")
    device = harness.add_device("kept")
    tokens = harness.login("survivor", "password-123")
    jwks = harness.call("GET", "/api/auth/jwks")[2]

    harness.stop_console()
    harness.start_console()

    assert harness.admin_password == admin_password          # not re-created on restart
    assert harness.call("GET", "/api/auth/jwks")[2] == jwks    # same signing keys
    status, _, me = harness.call("GET", "/api/me", tokens["access_token"])
    assert status == 200 and me["username"] == "survivor" and me["level"] == "operator"
    status, _, refreshed = harness.call("POST", "/api/auth/refresh",
                                        body={"refresh_token": tokens["refresh_token"]})
    assert status == 200
    status, _, listing = harness.call("GET", "/api/devices", refreshed["access_token"])
    assert [d["id"] for d in listing["data"]] == [device["id"]]
    # the sealed device key still opens with the key in the data dir
    status, _, models = harness.call("GET", f"/api/devices/{device['id']}/models",
                                     refreshed["access_token"])
    assert status == 200 and models["data"][0]["id"] == "tiny"
