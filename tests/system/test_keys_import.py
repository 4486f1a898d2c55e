"""`stackd keys import`: a key made elsewhere (a systemd credential) into the key store, as the
command line runs it; the store's own lookup (the daemon's) then accepts it."""
import hashlib
import json
import subprocess
import sys

import pytest

from stackd.auth.keys import KeyStore
from stackd.cli.keys_import import MAX_KEY, MIN_KEY

KEY = "sk-provisioned-0123456789abcdefghij"


def stackd(data, *args):
    return subprocess.run([sys.executable, "-m", "stackd", *args, "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=60)


def import_key(tmp_path, key: bytes | str | None, *extra, name="admin", permissions="admin"):
    path = tmp_path / "key"
    if key is not None:
        path.write_bytes(key.encode() if isinstance(key, str) else key)
    return stackd(tmp_path / "data", "keys", "import", "--name", name, "--permissions", permissions,
                  "--key-file", str(path), *extra)


def records(tmp_path):
    return json.loads((tmp_path / "data" / "keys.json").read_text())["keys"]


def test_an_imported_key_authenticates_with_its_permissions_and_only_its_digest_is_stored(tmp_path):
    done = import_key(tmp_path, KEY + "\n", permissions="inference,models:manage")
    assert done.returncode == 0, done.stderr
    assert "imported key" in done.stdout
    [record] = records(tmp_path)
    assert record["sha256"] == hashlib.sha256(KEY.encode()).hexdigest()
    assert KEY not in (tmp_path / "data" / "keys.json").read_text()
    found = KeyStore(str(tmp_path / "data")).lookup(KEY.encode())
    assert found is not None and found.name == "admin"
    assert found.allowed == frozenset({"inference", "models:manage"})
    assert KeyStore(str(tmp_path / "data")).lookup(KEY.encode() + b"x") is None
    listed = stackd(tmp_path / "data", "keys", "list")
    assert "\tadmin\t" in listed.stdout


def test_importing_the_same_key_again_changes_nothing(tmp_path):
    assert import_key(tmp_path, KEY).returncode == 0
    before = (tmp_path / "data" / "keys.json").read_bytes()
    again = import_key(tmp_path, KEY)
    assert again.returncode == 0 and "unchanged" in again.stdout
    assert (tmp_path / "data" / "keys.json").read_bytes() == before


def test_another_key_under_the_name_needs_replace_and_then_the_old_one_stops_working(tmp_path):
    assert import_key(tmp_path, KEY).returncode == 0
    other = "sk-rotated-abcdefabcdefabcdefabcdef"
    refused = import_key(tmp_path, other)
    assert refused.returncode == 1 and "--replace" in refused.stderr
    assert KeyStore(str(tmp_path / "data")).lookup(KEY.encode()) is not None
    # other permissions for the same key count as a different key too
    assert import_key(tmp_path, KEY, permissions="inference").returncode == 1
    replaced = import_key(tmp_path, other, "--replace")
    assert replaced.returncode == 0 and "replaced" in replaced.stdout
    store = KeyStore(str(tmp_path / "data"))
    assert store.lookup(KEY.encode()) is None and store.lookup(other.encode()).name == "admin"
    assert len(records(tmp_path)) == 1


def test_the_same_key_under_a_second_name_is_refused(tmp_path):
    assert import_key(tmp_path, KEY).returncode == 0
    refused = import_key(tmp_path, KEY, name="ops", permissions="inference")
    assert refused.returncode == 1 and "'admin'" in refused.stderr
    assert len(records(tmp_path)) == 1


def test_other_keys_in_the_store_are_left_alone(tmp_path):
    created = stackd(tmp_path / "data", "keys", "create", "--name", "app", "--permissions", "inference")
    app_key = created.stdout.splitlines()[-1]
    assert import_key(tmp_path, KEY).returncode == 0
    assert import_key(tmp_path, "sk-rotated-abcdefabcdefabcdefabcdef", "--replace").returncode == 0
    store = KeyStore(str(tmp_path / "data"))
    assert store.lookup(app_key.encode()).name == "app"
    assert sorted(r["name"] for r in records(tmp_path)) == ["admin", "app"]


@pytest.mark.parametrize("key, why", [
    (None, "cannot read the key file"),
    ("", "is empty"),
    ("\n  \n", "is empty"),
    ("x" * (MIN_KEY - 1), f"at least {MIN_KEY}"),
    ("x" * (MAX_KEY + 1), f"longer than {MAX_KEY}"),
    ("sk-has a-space-inside-0123456789", "visible ASCII"),
    ("sk-k\u00e9y-0123456789abcdefghijkl", "visible ASCII"),
    (b"sk-\x00nul-0123456789abcdefghijkl", "visible ASCII"),
])
def test_a_bad_key_file_is_one_clear_error_and_the_store_is_untouched(tmp_path, key, why):
    done = import_key(tmp_path, key)
    assert done.returncode == 1
    assert why in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "keys.json").exists()


def test_keys_at_the_length_limits_are_accepted(tmp_path):
    for i, length in enumerate((MIN_KEY, MAX_KEY)):
        key = "k" * (length - 1) + str(i)
        done = import_key(tmp_path, key, name=f"edge{i}", permissions="inference")
        assert done.returncode == 0, done.stderr
        assert KeyStore(str(tmp_path / "data")).lookup(key.encode()) is not None


@pytest.mark.parametrize("flags, why", [
    (("--name", "bad name"), "key name"),
    (("--permissions", "root"), "unknown permission"),
])
def test_a_bad_name_or_permission_is_refused(tmp_path, flags, why):
    (tmp_path / "key").write_text(KEY)
    args = dict(zip(("--name", "--permissions"), ("admin", "admin")))
    args[flags[0]] = flags[1]
    done = stackd(tmp_path / "data", "keys", "import", "--key-file", str(tmp_path / "key"),
                  *[x for pair in args.items() for x in pair])
    assert done.returncode == 1 and why in done.stderr and "Traceback" not in done.stderr
