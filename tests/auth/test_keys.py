import os
import stat

import pytest

from stackd.auth import permissions
from stackd.auth.keys import KeyStore, bootstrap_admin_key


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
