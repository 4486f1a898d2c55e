"""`console admin create` against the database of a running console (both backends)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def admin_create(harness, name: str, stdin: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STACKD_CONSOLE_DATABASE_URL": harness.database_url}
    return subprocess.run([sys.executable, "-m", "stackd", "console", "admin", "create",
                           "--data-dir", harness.data_dir, "--name", name],
                          input=stdin, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_admin_create_with_a_password_from_stdin_and_a_generated_one(shared):
    done = admin_create(shared, "ops-admin", "chosen-password\n")
    assert done.returncode == 0, done.stderr
    token = shared.login("ops-admin", "chosen-password")["access_token"]
    me = shared.call("GET", "/api/me", token)[2]
    assert me["level"] == "admin" and me["state"] == "approved"
    done = admin_create(shared, "ops-admin", "")             # a reset, with a generated password
    assert done.returncode == 0, done.stderr
    generated = done.stdout.strip().splitlines()[-1]
    assert shared.login("ops-admin", generated)["access_token"]
    assert shared.call("POST", "/api/auth/login", body={
        "username": "ops-admin", "password": "chosen-password"})[0] == 401


def test_admin_create_refuses_a_short_password(shared):
    done = admin_create(shared, "weak-admin", "short\n")
    assert done.returncode == 1 and "password" in done.stderr
