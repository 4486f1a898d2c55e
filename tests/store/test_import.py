"""Local files into the store (store/local.py over ModelStore.import_file): real GGUF files on
disk, every refusal path, the import directory's boundary, names and clashes, the limits."""
import os
import shutil

import pytest

from stackd.errors import Code, DomainError
from stackd.store.local import LocalImports, looks_like_path, name_for, resolve_under
from stackd.store.store import ModelStore, file_sha256
from tests.store.crafted import crafted
from tests.store.tiny import vocabulary, write_tiny


@pytest.fixture
def imports(tmp_path):
    store = ModelStore(str(tmp_path / "data"))
    os.makedirs(tmp_path / "import")
    return LocalImports(store, str(tmp_path / "import"), max_bytes=1 << 30, disk_reserve=0)


def tiny(path, **kwargs) -> str:
    return write_tiny(path, context_length=128, **kwargs)


def left_in_store(imports) -> tuple[list[str], list[str]]:
    return os.listdir(imports.store.blobs), os.listdir(imports.store.manifests)


def refused(call, code: Code, match: str = "") -> DomainError:
    with pytest.raises(DomainError) as caught:
        call()
    assert caught.value.code is code, caught.value.message
    assert match in caught.value.message
    return caught.value


def test_a_good_file_is_added_under_its_file_name_by_hard_link(imports):
    path = tiny(os.path.join(imports.import_dir, "Tiny-Model.Q4_1.gguf"))
    manifest = imports.add_requested("Tiny-Model.Q4_1.gguf")
    assert manifest.id == "tiny-model.q4_1" and manifest.source == "local" and manifest.kind == "chat"
    assert manifest.sha256 == file_sha256(path) and manifest.reference == path
    blob = imports.store.model_path(manifest)
    assert os.stat(blob).st_ino == os.stat(path).st_ino           # one filesystem, owner-only writes
    assert left_in_store(imports)[0] == [f"sha256-{manifest.sha256}"]   # no temp file left
    assert imports.store.get("tiny-model.q4_1") == manifest


def test_a_file_others_may_write_is_copied_not_linked(imports):
    path = tiny(os.path.join(imports.import_dir, "m.gguf"))
    os.chmod(path, 0o666)
    manifest = imports.add_requested("m.gguf", "shared:v1")
    blob = imports.store.model_path(manifest)
    assert os.stat(blob).st_ino != os.stat(path).st_ino and file_sha256(blob) == manifest.sha256
    assert os.stat(blob).st_mode & 0o777 == 0o600


def test_the_same_file_again_is_recognised_without_reading_it(imports, monkeypatch):
    tiny(os.path.join(imports.import_dir, "m.gguf"))
    first = imports.add_requested("m.gguf")
    monkeypatch.setattr("stackd.store.store.file_sha256", lambda path: pytest.fail("hashed again"))
    assert imports.add_requested("m.gguf") == first


@pytest.mark.parametrize("kind,match", [("truncated", "not a valid GGUF model"),
                                        ("absurd tensor count", "not a valid GGUF model"),
                                        ("huge string length", "not a valid GGUF model"),
                                        ("not gguf", "not a valid GGUF model")])
def test_a_crafted_structure_is_refused_and_leaves_nothing(imports, kind, match):
    good = open(tiny(os.path.join(imports.import_dir, "good.gguf")), "rb").read()
    with open(os.path.join(imports.import_dir, "bad.gguf"), "wb") as f:
        f.write(crafted(good, kind))
    refused(lambda: imports.add_requested("bad.gguf"), Code.INVALID, match)
    assert left_in_store(imports) == ([], [])


def test_a_vocabulary_the_rules_refuse_leaves_nothing(imports):
    tokens, _, _ = vocabulary()
    tokens[-1] = tokens[-2]
    tiny(os.path.join(imports.import_dir, "dup.gguf"), tokens=tokens)
    refused(lambda: imports.add_requested("dup.gguf"), Code.INVALID, "cannot be loaded by llama.cpp")
    assert left_in_store(imports) == ([], [])


def test_what_only_llama_cpps_own_load_refuses_leaves_nothing(imports):
    tiny(os.path.join(imports.import_dir, "arch.gguf"), arch="nosucharch")
    error = refused(lambda: imports.add_requested("arch.gguf"), Code.INVALID, "unknown model architecture")
    assert "cannot be loaded by llama.cpp" in error.message
    assert left_in_store(imports) == ([], [])


@pytest.mark.parametrize("requested", ["../outside.gguf", "sub/../../outside.gguf", "OUTSIDE", "/etc/passwd",
                                       "escape.gguf", "."])
def test_a_path_outside_the_import_directory_is_forbidden(imports, tmp_path, requested):
    outside = tiny(tmp_path / "outside.gguf")
    os.symlink(outside, os.path.join(imports.import_dir, "escape.gguf"))     # a link that leads out
    requested = outside if requested == "OUTSIDE" else requested
    refused(lambda: imports.add_requested(requested), Code.FORBIDDEN, "outside the import directory")
    assert left_in_store(imports) == ([], [])


def test_a_link_swapped_in_after_the_check_is_caught_on_the_opened_file(imports, tmp_path):
    outside = tiny(tmp_path / "outside.gguf")
    inside = os.path.join(imports.import_dir, "m.gguf")
    os.symlink(outside, inside)                    # as if swapped in between resolving and opening
    refused(lambda: imports.add(inside, within=imports.import_dir), Code.FORBIDDEN, "is not in")
    assert left_in_store(imports) == ([], [])


@pytest.mark.parametrize("requested,code", [("", Code.INVALID), ("a\x00b", Code.INVALID),
                                            ("x" * 4097, Code.INVALID), ("missing.gguf", Code.NOT_FOUND),
                                            ("dir.gguf", Code.INVALID), ("fifo.gguf", Code.INVALID)])
def test_paths_that_name_no_file(imports, requested, code):
    os.mkdir(os.path.join(imports.import_dir, "dir.gguf"))
    os.mkfifo(os.path.join(imports.import_dir, "fifo.gguf"))     # never blocks the open
    refused(lambda: imports.add_requested(requested), code)
    assert left_in_store(imports) == ([], [])


def test_a_name_clash_is_refused_but_the_same_file_is_no_clash(imports, tmp_path):
    tiny(os.path.join(imports.import_dir, "a.gguf"))
    tiny(os.path.join(imports.import_dir, "b.gguf"), rows=32)
    first = imports.add_requested("a.gguf", "m:1")
    refused(lambda: imports.add_requested("b.gguf", "m:1"), Code.TAKEN, "already has a model named 'm:1'")
    assert imports.store.get("m:1") == first
    assert left_in_store(imports)[0] == [f"sha256-{first.sha256}"]
    shutil.copy(os.path.join(imports.import_dir, "a.gguf"), os.path.join(imports.import_dir, "c.gguf"))
    assert imports.add_requested("c.gguf", "m:1").sha256 == first.sha256   # the same bytes


def test_a_preloaded_file_replaces_its_model_when_the_file_changes(imports, tmp_path):
    path = tiny(tmp_path / "shipped.gguf")
    assert imports.add_preloaded(path) == "shipped"
    first = imports.store.get("shipped")
    tiny(tmp_path / "shipped.gguf", rows=32)          # a firmware update ships a new file
    assert imports.add_preloaded(path) == "shipped"
    assert imports.store.get("shipped").sha256 != first.sha256
    assert left_in_store(imports)[0] != [f"sha256-{first.sha256}"]


@pytest.mark.parametrize("name", ["UPPER", "a/b/c", "hf.co/user/repo", "../x", "a b", "x" * 65, ""])
def test_bad_names_are_refused_before_any_work(imports, name):
    tiny(os.path.join(imports.import_dir, "m.gguf"))
    refused(lambda: imports.add_requested("m.gguf", name), Code.INVALID, "model names are")


@pytest.mark.parametrize("file,name", [("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", "qwen2.5-0.5b-instruct-q4_k_m"),
                                       ("model.GGUF", "model"), ("a b (1).gguf", "a-b-1"),
                                       ("x" * 80 + ".gguf", "x" * 64)])
def test_names_from_file_names(file, name):
    assert name_for(f"/some/where/{file}") == name


def test_a_file_name_without_letters_needs_a_name():
    with pytest.raises(DomainError, match="give one"):
        name_for("/x/___.gguf")


@pytest.mark.parametrize("entry,is_path", [("/abs/m.gguf", True), ("./m.gguf", True), ("../m", True),
                                           ("~/m.gguf", True), ("m.gguf", True), ("smollm2-135m-instruct", False),
                                           ("library/tiny:latest", False)])
def test_preload_entries_that_are_files(entry, is_path):
    assert looks_like_path(entry) is is_path


def test_the_size_limit_at_its_edge(imports):
    path = tiny(os.path.join(imports.import_dir, "m.gguf"))
    size = os.path.getsize(path)
    imports.max_bytes = size - 1
    refused(lambda: imports.add_requested("m.gguf"), Code.TOO_LARGE, "models.max_pull_gb")
    assert left_in_store(imports) == ([], [])
    imports.max_bytes = size
    assert imports.add_requested("m.gguf").size == size


def test_a_copy_that_would_fill_the_disk_is_refused(imports):
    path = tiny(os.path.join(imports.import_dir, "m.gguf"))
    os.chmod(path, 0o664)                          # group-writable: copied, so the reserve applies
    free = shutil.disk_usage(imports.store.blobs).free
    imports.disk_reserve = free
    refused(lambda: imports.add_requested("m.gguf"), Code.INSUFFICIENT_MEMORY, "models.disk_reserve_mb")
    assert left_in_store(imports) == ([], [])


def test_resolve_under_keeps_paths_inside(tmp_path):
    assert resolve_under(str(tmp_path), "a/b.gguf") == os.path.join(os.path.realpath(tmp_path), "a/b.gguf")
    assert resolve_under(str(tmp_path), str(tmp_path / "c.gguf")).endswith("/c.gguf")
    with pytest.raises(DomainError):
        resolve_under(str(tmp_path / "im"), str(tmp_path / "import-elsewhere" / "x.gguf"))
