"""The model store: ids never become paths, blobs are content-addressed, nothing escapes."""
import hashlib
import os

import pytest

from server.models.store import ModelStore, StoreError, file_sha256, valid_model_id
from tests.models.tiny import write_tiny


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
