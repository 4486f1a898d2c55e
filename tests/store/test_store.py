"""The model store: ids never become paths, blobs are content-addressed, nothing escapes."""
import hashlib
import os
import stat

import pytest

from stackd.store.store import ModelStore, StoreError, file_sha256, valid_model_id
from stackd.store.vocab_check import VocabError
from tests.store.crafted import old_store_manifest
from tests.store.tiny import vocabulary, write_tiny


def tiny_gguf(path, **kwargs) -> str:
    return write_tiny(path, context_length=128, **kwargs)


@pytest.mark.parametrize("model_id", ["smollm2-135m-instruct", "all-minilm-l6-v2", "library/smollm2:latest",
                                      "qwen2.5:0.5b", "a", "x" * 64])
def test_valid_ids(model_id):
    assert valid_model_id(model_id)


@pytest.mark.parametrize("model_id", ["", "../etc/passwd", "a/../b", "/abs", "UPPER", "a b", "a\x00b",
                                      "a\\b", "a:b:c", "x" * 65, "a/b/c", ".hidden", "-x", "a:", "a::b",
                                      "ns/" + "x" * 200, 5, None])
def test_invalid_ids_never_reach_a_path(tmp_path, model_id):
    store = ModelStore(str(tmp_path))
    assert not valid_model_id(model_id)
    with pytest.raises((StoreError, TypeError)):
        store.get(model_id)
    assert os.listdir(store.manifests) == []


def test_import_is_content_addressed_and_idempotent(tmp_path):
    source = tiny_gguf(tmp_path / "m.gguf")
    store = ModelStore(str(tmp_path / "data"))
    manifest = store.import_file("tiny", source)
    digest = file_sha256(source)
    assert manifest.sha256 == digest and manifest.file == f"blobs/sha256-{digest}"
    assert manifest.architecture == "llama" and manifest.kind == "chat" and manifest.context_length == 128
    assert os.listdir(store.manifests) == [hashlib.sha256(b"tiny").hexdigest() + ".json"]
    assert store.import_file("tiny", source) == manifest
    assert [m.id for m in store.list()] == ["tiny"]
    assert store.model_path(manifest) == os.path.join(store.blobs, f"sha256-{digest}")


def test_remove_keeps_blobs_that_another_model_uses(tmp_path):
    source = tiny_gguf(tmp_path / "m.gguf")
    store = ModelStore(str(tmp_path / "data"))
    first = store.import_file("one", source)
    store.import_file("two", source)
    store.remove("one")
    assert os.path.exists(store.blob_path(first.sha256))
    store.remove("two")
    assert not os.path.exists(store.blob_path(first.sha256))
    with pytest.raises(KeyError):
        store.remove("two")


@pytest.mark.parametrize("digest", ["../x", "sha256-abc", "A" * 64, "0" * 63, "0" * 65, "g" * 64])
def test_blob_paths_only_from_real_digests(tmp_path, digest):
    with pytest.raises(StoreError):
        ModelStore(str(tmp_path)).blob_path(digest)


def test_a_blob_symlinked_out_of_the_store_is_refused(tmp_path):
    source = tiny_gguf(tmp_path / "m.gguf")
    store = ModelStore(str(tmp_path / "data"))
    manifest = store.import_file("tiny", source)
    blob = store.blob_path(manifest.sha256)
    os.unlink(blob)
    os.symlink(source, blob)
    with pytest.raises(StoreError):
        store.model_path(manifest)


def test_a_damaged_manifest_hides_only_its_model(tmp_path):
    source = tiny_gguf(tmp_path / "m.gguf")
    store = ModelStore(str(tmp_path / "data"))
    store.import_file("good", source)
    with open(os.path.join(store.manifests, "0" * 64 + ".json"), "w") as f:
        f.write("{not json")
    assert [m.id for m in store.list()] == ["good"]


# ---- the 200-character id limit, at its edge

def id_of_length(n: int) -> str:
    """A well-formed 'namespace/name:tag' id of exactly n characters (n from 131 to 258)."""
    return "n" * 64 + "/" + "m" * 64 + ":" + "t" * (n - 130)


def test_model_ids_are_at_most_200_characters(tmp_path):
    store = ModelStore(str(tmp_path))
    longest, too_long = id_of_length(200), id_of_length(201)
    assert len(longest) == 200 and valid_model_id(longest)
    assert len(too_long) == 201 and not valid_model_id(too_long)
    assert store.get(longest) is None
    with pytest.raises(StoreError):
        store.get(too_long)


# ---- ids that differ only in case are two models

def test_tags_differing_in_case_are_two_models(tmp_path):
    source = tiny_gguf(tmp_path / "m.gguf")
    store = ModelStore(str(tmp_path / "data"))
    upper = store.import_file("m:V1", source)
    lower = store.import_file("m:v1", source)
    assert (upper.id, lower.id) == ("m:V1", "m:v1")
    assert len(os.listdir(store.manifests)) == 2
    assert store.get("m:V1").id == "m:V1" and store.get("m:v1").id == "m:v1"
    assert [m.id for m in store.list()] == ["m:V1", "m:v1"]
    store.remove("m:v1")
    assert store.get("m:V1") is not None and store.get("m:v1") is None


# ---- the vocabulary check on import, and for manifests of an older store

def duplicate_token_gguf(path) -> str:
    tokens, _, _ = vocabulary()
    tokens[-1] = tokens[-2]                 # one token twice: llama.cpp would abort at load
    return write_tiny(path, tokens=tokens)


@pytest.mark.parametrize("source", ["default", "local"])
def test_import_refuses_a_vocabulary_llama_cpp_cannot_load_and_keeps_nothing(tmp_path, source):
    bad = duplicate_token_gguf(tmp_path / "dup.gguf")
    store = ModelStore(str(tmp_path / "data"))
    with pytest.raises(VocabError, match="twice"):
        store.import_file("dup", bad, source=source)
    assert os.listdir(store.blobs) == [] and os.listdir(store.manifests) == []
    assert store.list() == []


def test_a_manifest_from_an_older_store_is_checked_before_a_load(tmp_path):
    store = ModelStore(str(tmp_path / "data"))
    bad = old_store_manifest(store, duplicate_token_gguf(tmp_path / "dup.gguf"), "old/dup:latest")
    good = old_store_manifest(store, tiny_gguf(tmp_path / "ok.gguf"), "old/ok:latest")
    assert not bad.vocab_checked and not good.vocab_checked
    with pytest.raises(VocabError, match="twice"):
        store.ensure_loadable(bad)
    assert not store.get("old/dup:latest").vocab_checked
    assert store.ensure_loadable(good).vocab_checked
    assert store.get("old/ok:latest").vocab_checked          # recorded: checked once
    assert store.import_file("new", tiny_gguf(tmp_path / "n.gguf")).vocab_checked


# ---- the data dir is private from its creation

def test_a_new_data_dir_is_private(tmp_path):
    previous = os.umask(0o022)
    try:
        ModelStore(str(tmp_path / "data"))
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "data").st_mode) == 0o700
