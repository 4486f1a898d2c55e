"""The model store, through ModelStore: ids never become paths (the id rules, the 200-character
limit at its edge, case in tags), blobs are content-addressed and nothing escapes, the on-disk
layout, listing order and stray files, re-imports, which blobs a removal frees, the vocabulary
check, and a private data dir."""
import hashlib
import os
import stat
import time

import orjson
import pytest

from stackd.store import store as store_module
from stackd.store.store import Manifest, ModelStore, StoreError, file_sha256, valid_model_id
from stackd.store.vocab_check import VocabError

from tests.store.crafted import old_store_manifest
from tests.store.tiny import vocabulary, write_tiny


def tiny_gguf(path, rows=16, **kwargs) -> str:
    return write_tiny(path, context_length=128, rows=rows, **kwargs)



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


def test_remove_takes_the_models_prompt_cache_with_its_blob(tmp_path):
    """The prompt cache's files of a model (native/engine/prompt_cache.h) go when its blob goes,
    not while another model keeps the blob; another blob's files stay."""
    source = tiny_gguf(tmp_path / "m.gguf")
    store = ModelStore(str(tmp_path / "data"))
    first = store.import_file("one", source)
    store.import_file("two", source)
    mine, other = store.prompt_cache_dir(first.sha256), store.prompt_cache_dir("0" * 64)
    for directory in (mine, other):
        os.makedirs(directory)
        open(os.path.join(directory, "a.kv"), "wb").close()
    assert os.path.dirname(mine) == store.prompt_cache == os.path.join(store.root, "kv")
    store.remove("one")
    assert os.path.exists(os.path.join(mine, "a.kv"))
    store.remove("two")
    assert not os.path.exists(mine) and os.path.exists(os.path.join(other, "a.kv"))
    with pytest.raises(StoreError):
        store.prompt_cache_dir("../x")


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


@pytest.mark.parametrize("origin", ["default", "local"])
def test_import_refuses_a_vocabulary_llama_cpp_cannot_load_and_keeps_nothing(tmp_path, origin):
    bad = duplicate_token_gguf(tmp_path / "dup.gguf")
    store = ModelStore(str(tmp_path / "data"))
    with pytest.raises(VocabError, match="twice"):
        store.import_file("dup", bad, source=origin)
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


# ---- layout, listing, re-imports and removals -----------------------------------------------

@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf")


@pytest.fixture(scope="module")
def bigger(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "bigger.gguf", rows=32)


@pytest.fixture
def store(tmp_path):
    return ModelStore(str(tmp_path / "data"))


def manifest_file(store, model_id) -> str:
    return os.path.join(store.manifests, hashlib.sha256(model_id.encode()).hexdigest() + ".json")


def test_the_layout_under_the_data_dir(tmp_path):
    store = ModelStore(str(tmp_path / "data"))
    assert store.root == str(tmp_path / "data" / "models")
    assert sorted(os.listdir(store.root)) == ["blobs", "manifests"]
    assert store.blobs == os.path.join(store.root, "blobs")
    assert store.manifests == os.path.join(store.root, "manifests")
    ModelStore(str(tmp_path / "data"))                          # opening it again is fine


def test_an_invalid_id_is_refused_with_the_rules(store):
    with pytest.raises(StoreError) as refused:
        store.put(Manifest(id="Bad", file="", size=0, sha256="0" * 64, architecture="", kind="chat",
                           quantization="", parameter_count=0, context_length=None))
    assert str(refused.value) == ("model ids are 1-200 characters: lower-case letters, digits, '.', "
                                  "'_', '-', an optional 'namespace/' and an optional ':tag'")
    assert os.listdir(store.manifests) == []


def test_a_manifest_filed_under_another_id_is_not_returned(store, source):
    store.import_file("real", source)
    os.rename(manifest_file(store, "real"), manifest_file(store, "other"))
    assert store.get("other") is None
    assert store.get("real") is None


def test_import_describes_the_gguf(store, source):
    before = int(time.time())
    manifest = store.import_file("tiny", source)
    digest = file_sha256(source)
    assert manifest.id == "tiny" and manifest.source == "default" and manifest.reference is None
    assert manifest.size == os.path.getsize(source) and manifest.sha256 == digest
    assert manifest.file == f"blobs/sha256-{digest}"
    assert (manifest.architecture, manifest.kind, manifest.context_length) == ("llama", "chat", 128)
    assert (manifest.n_layer, manifest.n_embd, manifest.n_head) == (1, 8, 2)
    assert manifest.extra == {} and before <= manifest.created <= int(time.time())
    assert store.get("tiny") == manifest
    assert stat.S_IMODE(os.stat(manifest_file(store, "tiny")).st_mode) == 0o600
    assert orjson.loads(open(manifest_file(store, "tiny"), "rb").read()) == manifest.to_json()
    with open(store.model_path(manifest), "rb") as blob, open(source, "rb") as original:
        assert blob.read() == original.read()


def test_a_blob_is_described_with_its_gguf_facts_and_provenance(store, source):
    digest = store.import_file("first", source).sha256
    manifest = store.manifest_for_blob("pulled", digest, source="registry", reference="r/m:1",
                                       extra={"application/x-template": "sha256:" + "1" * 64})
    assert (manifest.id, manifest.source, manifest.reference) == ("pulled", "registry", "r/m:1")
    assert manifest.extra == {"application/x-template": "sha256:" + "1" * 64}
    assert (manifest.quantization, manifest.parameter_count) == ("F32", 16 * 8)
    assert manifest.file == f"blobs/sha256-{digest}" and manifest.size == os.path.getsize(source)


def test_import_records_its_source(store, source):
    assert store.import_file("local", source, source="local").source == "local"


def test_file_sha256_reads_the_whole_file_in_bounded_chunks(tmp_path, monkeypatch):
    """A model of many GiB is hashed without holding it in memory."""
    path = tmp_path / "f"
    path.write_bytes(b"abc" * 1000)
    reads = []

    class Recorded:
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def read(self, size=-1):
            reads.append(size)
            return self.file.read(size)

    monkeypatch.setattr(store_module, "HASH_CHUNK", 7)
    monkeypatch.setattr(store_module, "open", lambda *a: Recorded(open(*a)), raising=False)
    assert file_sha256(str(path)) == hashlib.sha256(b"abc" * 1000).hexdigest()
    assert reads and all(size == 7 for size in reads)


def test_reimporting_a_different_file_under_the_same_id_replaces_it(store, source, bigger):
    first = store.import_file("m", source)
    second = store.import_file("m", bigger)
    assert second.sha256 == file_sha256(bigger) != first.sha256
    assert store.get("m") == second


def test_reimporting_a_same_sized_file_keeps_the_manifest(store, tmp_path, source, monkeypatch):
    first = store.import_file("m", source)
    monkeypatch.setattr(store_module, "file_sha256", lambda path: pytest.fail("hashed again"))
    assert store.import_file("m", source) == first


def test_reimport_restores_a_missing_blob(store, source):
    manifest = store.import_file("m", source)
    os.unlink(store.model_path(manifest))
    again = store.import_file("m", source)
    assert again.sha256 == manifest.sha256 and os.path.exists(store.model_path(again))


def test_two_ids_share_one_blob(store, source):
    one = store.import_file("one", source)
    two = store.import_file("two", source)
    assert one.sha256 == two.sha256
    assert os.listdir(store.blobs) == [f"sha256-{one.sha256}"]


def test_a_file_on_another_device_is_copied(store, source, monkeypatch):
    def no_links(src, dst, **kwargs):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(os, "link", no_links)
    manifest = store.import_file("m", source)
    assert os.path.getsize(store.model_path(manifest)) == os.path.getsize(source)
    assert os.listdir(store.blobs) == [f"sha256-{manifest.sha256}"]      # no partial left


def test_listing_is_sorted_by_id_and_skips_stray_files(store, source):
    ids = ["zeta", "alpha", "mid", "beta"]
    for model_id in ids:
        store.import_file(model_id, source)
    for stray in ("0" * 10 + ".tmp", "1.json.partial"):
        with open(os.path.join(store.manifests, stray), "w") as f:
            f.write("{}")
    with open(os.path.join(store.manifests, "0" * 64 + ".json"), "w") as f:
        f.write('{"id": "broken"}')                              # missing fields
    assert [m.id for m in store.list()] == sorted(ids)


def layer(store, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    with open(store.blob_path(digest), "wb") as f:
        f.write(data)
    return digest


def with_layers(store, source, model_id, extra) -> Manifest:
    manifest = store.import_file(model_id, source)
    manifest.extra = extra
    store.put(manifest)
    return manifest


def test_removing_a_model_frees_its_layers_unless_another_model_uses_them(store, source):
    shared = layer(store, b"template")
    own = layer(store, b"params")
    with_layers(store, source, "one", {"template": f"sha256:{shared}", "params": f"sha256:{own}"})
    with_layers(store, source, "two", {"template": f"sha256:{shared}"})
    removed = store.remove("one")
    assert removed.id == "one" and store.get("one") is None
    assert os.path.exists(store.blob_path(shared))
    assert not os.path.exists(store.blob_path(own))
    assert os.path.exists(store.model_path(removed))            # "two" still uses the weights
    store.remove("two")
    assert os.listdir(store.blobs) == []
    assert os.listdir(store.manifests) == []


def test_a_layer_used_as_another_models_weights_is_kept(store, source, bigger):
    weights = store.import_file("base", source)
    with_layers(store, bigger, "other",
                {"adapter": f"sha256:{weights.sha256}"})
    store.remove("other")
    assert os.path.exists(store.model_path(weights))


def test_removal_tolerates_missing_and_malformed_layers(store, source):
    with_layers(store, source, "m", {"gone": "sha256:" + "1" * 64, "odd": "sha256:nothex"})
    store.remove("m")
    assert os.listdir(store.blobs) == [] and store.get("m") is None


def test_removing_an_unknown_model_is_a_key_error(store):
    with pytest.raises(KeyError) as missing:
        store.remove("nothing")
    assert missing.value.args == ("nothing",)


def test_a_bad_digest_message_shows_at_most_80_characters(store):
    with pytest.raises(StoreError) as refused:
        store.blob_path("z" * 100)
    assert str(refused.value) == f"not a sha256 digest: {'z' * 80!r}"


def test_a_blob_path_is_inside_the_blobs_directory(store):
    assert store.blob_path("a" * 64) == os.path.join(store.blobs, "sha256-" + "a" * 64)


def test_a_model_path_that_escapes_names_the_model(store, source, tmp_path):
    manifest = store.import_file("tiny", source)
    blob = store.blob_path(manifest.sha256)
    os.unlink(blob)
    os.symlink(source, blob)
    with pytest.raises(StoreError) as refused:
        store.model_path(manifest)
    assert "model tiny: blob path escapes the store" == str(refused.value)
