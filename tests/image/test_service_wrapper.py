"""packaging/stackd-service: systemd's credentials and directories, turned into the daemon's
key store, cluster secret and settings before it execs `stackd` (here `stackd keys list`)."""
import hashlib
import json
import os
import stat
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRAPPER = os.path.join(ROOT, "packaging", "stackd-service")


def run(tmp_path, credentials: dict[str, str] | None, *args: str) -> subprocess.CompletedProcess:
    state, etc = tmp_path / "state", tmp_path / "etc"
    state.mkdir(exist_ok=True)
    etc.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STACKD_", "CREDENTIALS_DIRECTORY"))}
    env.update(STATE_DIRECTORY=str(state), CONFIGURATION_DIRECTORY=str(etc))
    if credentials is not None:
        creds = tmp_path / "creds"
        creds.mkdir(exist_ok=True)
        for name, value in credentials.items():
            (creds / name).write_text(value)
            (creds / name).chmod(0o400)
        env["CREDENTIALS_DIRECTORY"] = str(creds)
    # the wrapper execs the `stackd` of its own interpreter's prefix: this venv's
    return subprocess.run([sys.executable, WRAPPER, *(args or ("keys", "list"))], env=env,
                          capture_output=True, text=True, timeout=60)


def stored_keys(tmp_path) -> list[dict]:
    return json.loads((tmp_path / "state" / "keys.json").read_text())["keys"]


def test_the_admin_key_credential_becomes_the_stores_admin_key(tmp_path):
    key = "sk-from-the-credential-0123456789abcdef"
    done = run(tmp_path, {"stackd.admin-key": key + "\n"})
    assert done.returncode == 0, done.stderr
    assert "\tadmin\t" in done.stdout
    [record] = stored_keys(tmp_path)
    assert record["sha256"] == hashlib.sha256(key.encode()).hexdigest()
    assert key not in (tmp_path / "state" / "keys.json").read_text()      # only its digest
    # a second start changes nothing; a new credential replaces the admin key
    run(tmp_path, {"stackd.admin-key": key})
    assert stored_keys(tmp_path) == [record]
    run(tmp_path, {"stackd.admin-key": "sk-rotated-key-abcdefabcdefabcdef"})
    [rotated] = stored_keys(tmp_path)
    assert rotated["sha256"] == hashlib.sha256(b"sk-rotated-key-abcdefabcdefabcdef").hexdigest()


def test_a_credential_replaces_the_key_a_first_start_generated(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "admin.key").write_text("sk-generated\n")
    run(tmp_path, {"stackd.admin-key": "sk-given-key-0123456789abcdef"})
    assert not (tmp_path / "state" / "admin.key").exists()


def test_without_credentials_a_cluster_secret_is_generated_once_owner_only(tmp_path):
    for credentials in (None, {"stackd.admin-key": "none", "stackd.cluster-secret": "none"}):
        done = run(tmp_path, credentials)
        assert done.returncode == 0, done.stderr
        path = tmp_path / "state" / "cluster.secret"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert len(path.read_text().strip()) >= 32
    assert not (tmp_path / "state" / "keys.json").exists()     # `none`: no admin key given
    secret = path.read_text()
    run(tmp_path, None)
    assert path.read_text() == secret


def test_a_cluster_secret_credential_is_used_where_systemd_put_it(tmp_path):
    done = run(tmp_path, {"stackd.cluster-secret": "a-secret-of-the-whole-cluster"})
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "state" / "cluster.secret").exists()


def test_a_credential_the_key_import_refuses_stops_the_start_with_its_reason(tmp_path):
    done = run(tmp_path, {"stackd.admin-key": "sk-short"})
    assert done.returncode != 0
    assert "at least 16" in done.stderr and "stackd.admin-key" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "state" / "keys.json").exists()
