"""API keys and permissions (server/auth/keys.py, permissions.py) at their edges: what a key is,
what the key file holds and how it reloads, the name rules on both sides, revocation, the
admin key's bootstrap, and permission lists."""
import os
import re
import stat

import orjson
import pytest

from stackd.auth import permissions
from stackd.auth.keys import KeyStore, bootstrap_admin_key


@pytest.fixture
def store(tmp_path):
    return KeyStore(str(tmp_path))


def test_created_key_authenticates_and_only_its_hash_is_stored(tmp_path):
    store = KeyStore(str(tmp_path))
    record, key = store.create("ci", frozenset({permissions.INFERENCE}))
    assert key.startswith("sk-") and len(key) > 40
    assert store.lookup(key.encode()) == record
    text = (tmp_path / "keys.json").read_text()
    assert key not in text and key[8:] not in text
    assert record.digest.hex() in text
    assert stat.S_IMODE(os.stat(tmp_path / "keys.json").st_mode) == 0o600


def test_unknown_and_near_miss_keys_are_refused(tmp_path):
    store = KeyStore(str(tmp_path))
    _, key = store.create("ci", frozenset({permissions.INFERENCE}))
    assert store.lookup(b"sk-nope") is None
    assert store.lookup(key[:-1].encode()) is None
    assert store.lookup(b"") is None


def test_admin_implies_every_permission(tmp_path):
    record, _ = KeyStore(str(tmp_path)).create("root", frozenset({permissions.ADMIN}))
    assert record.allowed == frozenset(permissions.ALL)


def test_revoke_by_name_or_id(tmp_path):
    store = KeyStore(str(tmp_path))
    first, key1 = store.create("one", frozenset({permissions.INFERENCE}))
    _, key2 = store.create("two", frozenset({permissions.INFERENCE}))
    store.revoke("one")
    assert store.lookup(key1.encode()) is None
    store.revoke(store.lookup(key2.encode()).id)
    assert store.lookup(key2.encode()) is None
    with pytest.raises(KeyError):
        store.revoke("one")


def test_another_process_writing_the_file_is_picked_up(tmp_path):
    daemon_side = KeyStore(str(tmp_path))
    generation = daemon_side.generation
    _, key = KeyStore(str(tmp_path)).create("late", frozenset({permissions.INFERENCE}))
    assert daemon_side.lookup(key.encode()) is None
    assert daemon_side.reload_if_changed()
    assert daemon_side.lookup(key.encode()) is not None
    assert daemon_side.generation == generation + 1
    assert not daemon_side.reload_if_changed()


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "slash/name", "../x"])
def test_bad_names_are_refused(tmp_path, name):
    with pytest.raises(ValueError):
        KeyStore(str(tmp_path)).create(name, frozenset({permissions.INFERENCE}))


def test_duplicate_names_are_refused(tmp_path):
    store = KeyStore(str(tmp_path))
    store.create("x", frozenset({permissions.INFERENCE}))
    with pytest.raises(ValueError):
        store.create("x", frozenset({permissions.INFERENCE}))


def test_bootstrap_writes_an_admin_key_once(tmp_path):
    store = KeyStore(str(tmp_path))
    path = bootstrap_admin_key(store, str(tmp_path))
    key = open(path).read().strip()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert store.lookup(key.encode()).allowed == frozenset(permissions.ALL)
    assert bootstrap_admin_key(store, str(tmp_path)) is None


@pytest.mark.parametrize("text,expected", [
    ("inference", {"inference"}),
    ("inference, cluster:read", {"inference", "cluster:read"}),
    ("models:manage,cluster:write", {"models:manage", "cluster:write"}),
])
def test_permission_parsing(text, expected):
    assert permissions.parse(text) == frozenset(expected)


@pytest.mark.parametrize("text", ["", "root", "inference,clusterread", " , "])
def test_bad_permissions_are_refused(text):
    with pytest.raises(ValueError):
        permissions.parse(text)


# ---- the key store at its edges ---------------------------------------------------------------

def test_a_new_key_has_256_bits_an_id_and_a_hint(store):
    record, key = store.create("app", frozenset({permissions.INFERENCE}))
    assert re.fullmatch(r"sk-[A-Za-z0-9_-]{43}", key)
    assert re.fullmatch(r"key_[0-9a-f]{12}", record.id)
    assert record.hint == key[:8] and record.name == "app"
    assert record.permissions == frozenset({permissions.INFERENCE}) == record.allowed


def test_the_key_file_lists_each_key_without_its_secret(store, tmp_path):
    record, key = store.create("app", frozenset({permissions.MODELS_MANAGE, permissions.INFERENCE}))
    saved = orjson.loads((tmp_path / "keys.json").read_bytes())
    assert saved == {"version": 1, "keys": [{
        "id": record.id, "name": "app", "sha256": record.digest.hex(),
        "permissions": ["inference", "models:manage"], "created_at": record.created_at,
        "hint": key[:8]}]}
    assert stat.S_IMODE(os.stat(tmp_path / "keys.json.lock").st_mode) == 0o600


def test_a_key_file_without_hints_still_loads(tmp_path):
    (tmp_path / "keys.json").write_bytes(orjson.dumps({"version": 1, "keys": [{
        "id": "key_1", "name": "old", "sha256": "00" * 32, "permissions": ["admin"],
        "created_at": "7"}]}))
    [record] = KeyStore(str(tmp_path)).records()
    assert (record.hint, record.created_at, record.allowed) == ("", 7, frozenset(permissions.ALL))


def test_a_key_file_without_a_key_list_holds_no_keys(tmp_path):
    (tmp_path / "keys.json").write_bytes(b'{"version": 1}')
    store = KeyStore(str(tmp_path))
    assert store.records() == [] and store.is_empty() and store.lookup(b"sk-x") is None


def test_records_are_listed_oldest_first_then_by_name(tmp_path):
    keys = [{"id": f"key_{i}", "name": name, "sha256": f"{i:064x}", "permissions": ["inference"],
             "created_at": created} for i, (name, created) in enumerate(
                 [("b", 2), ("c", 1), ("a", 2), ("d", 3)])]
    (tmp_path / "keys.json").write_bytes(orjson.dumps({"version": 1, "keys": keys}))
    assert [r.name for r in KeyStore(str(tmp_path)).records()] == ["c", "a", "b", "d"]


def test_an_empty_store_has_no_records_and_stays_at_generation_zero(store):
    assert store.records() == [] and store.is_empty()
    assert store.generation == 0
    assert not store.reload_if_changed() and store.generation == 0


def test_each_change_bumps_the_generation_once(store):
    _, key = store.create("a", frozenset({permissions.INFERENCE}))
    assert store.generation == 1 and not store.is_empty()
    store.revoke("a")
    assert store.generation == 2 and store.lookup(key.encode()) is None
    assert store.is_empty()


def test_a_deleted_key_file_empties_the_table(store, tmp_path):
    _, key = store.create("a", frozenset({permissions.INFERENCE}))
    os.unlink(tmp_path / "keys.json")
    assert store.reload_if_changed() and store.lookup(key.encode()) is None


def test_names_at_the_edge_of_the_rules(store):
    store.create("a" * 64, frozenset({permissions.INFERENCE}))
    store.create("A.b_c-9", frozenset({permissions.INFERENCE}))
    with pytest.raises(ValueError) as bad:
        store.create("a" * 65, frozenset({permissions.INFERENCE}))
    assert str(bad.value) == "key name must be 1-64 characters of letters, digits, '.', '_' or '-'"
    with pytest.raises(ValueError) as taken:
        store.create("A.b_c-9", frozenset({permissions.INFERENCE}))
    assert "'A.b_c-9' exists already" in str(taken.value)


def test_revoke_returns_the_revoked_key_and_leaves_the_others(store):
    first, _ = store.create("one", frozenset({permissions.INFERENCE}))
    second, key2 = store.create("two", frozenset({permissions.INFERENCE}))
    assert store.revoke(first.id) == first
    assert store.records() == [second] and store.lookup(key2.encode()) == second
    with pytest.raises(KeyError) as missing:
        store.revoke("one")
    assert "no key named 'one'" in str(missing.value)


def test_bootstrap_writes_the_admin_key_file(store, tmp_path):
    path = bootstrap_admin_key(store, str(tmp_path))
    assert path == str(tmp_path / "admin.key")
    text = open(path).read()
    assert text.endswith("\n") and text.count("\n") == 1
    [record] = store.records()
    assert record.name == "admin" and record.permissions == frozenset({permissions.ADMIN})
    assert store.lookup(text[:-1].encode()) == record


# ---- permissions -----------------------------------------------------------------------------

def test_permission_lists_ignore_blanks_and_name_the_first_unknown():
    assert permissions.parse(" admin ,, inference ") == frozenset({"admin", "inference"})
    with pytest.raises(ValueError) as unknown:
        permissions.parse("inference, root, sudo")
    assert str(unknown.value) == ("unknown permission 'root'; choose from inference, cluster:read, "
                                  "cluster:write, models:manage, admin")
    with pytest.raises(ValueError) as empty:
        permissions.parse(",")
    assert str(empty.value) == "at least one permission is required"


def test_only_admin_expands():
    granted = frozenset({permissions.INFERENCE, permissions.CLUSTER_WRITE})
    assert permissions.effective(granted) == granted
    assert permissions.effective(frozenset({permissions.ADMIN})) == frozenset(permissions.ALL)
