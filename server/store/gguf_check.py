"""Validate a GGUF model file before it is accepted into the model store.

Model files are untrusted input that ends up in llama.cpp's C++ parser, so this
module walks the header, the metadata and the tensor table itself, over the raw
bytes, and refuses anything malformed with a ``GGUFError`` that says what is
wrong and where. It never hands the file to another GGUF reader and never
allocates from a count in the file before checking that the count fits in the
bytes that are actually there.

The file is read with ``os.pread`` through a small window (1 MiB), not mapped,
so a file that shrinks while it is being checked is an error, not a SIGBUS,
and a huge file costs no more memory than a small one.

Layout (little endian; GGUF v2 and v3 share it):

    "GGUF" u32 version  u64 tensor_count  u64 metadata_kv_count
    metadata_kv_count x { string key; u32 value_type; value }
    tensor_count x { string name; u32 n_dims; u64 dims[n_dims]; u32 ggml_type; u64 offset }
    padding to the alignment, then the tensor data section
    (string = u64 length + bytes; array = u32 element_type + u64 count + elements)

`python -m stackd.store.vocab_check FILE.gguf ...` runs these checks and the vocabulary's.
"""
from __future__ import annotations

import functools
import os
import stat
import struct
from collections import Counter
from dataclasses import dataclass
from collections.abc import Callable, Iterator
from typing import Any

from ..system.imports import module_from_package_file

__all__ = ["GGUFError", "GGUFInfo", "Metadata", "check_gguf"]


class GGUFError(ValueError):
    """A GGUF file was refused. The message is meant for the user."""


@dataclass(frozen=True)
class GGUFInfo:
    version: int
    architecture: str            # general.architecture
    name: str | None             # general.name
    kind: str                    # "embedding" or "chat"
    quantization: str            # "Q4_1", "Q8_0", "F16", ...
    parameter_count: int         # sum of tensor element counts
    context_length: int | None   # <arch>.context_length
    embedding_length: int | None # <arch>.embedding_length
    block_count: int | None      # <arch>.block_count
    head_count_kv: int | None    # <arch>.attention.head_count_kv (falls back to head_count)
    head_count: int | None       # <arch>.attention.head_count
    tensor_count: int
    tensor_data_bytes: int       # bytes of tensor data as declared by the tensor table
    file_size: int
    block_elements: int = 0      # weights of the repeating layers' tensors (blk.*)
    output_elements: int = 0     # weights of the output matrix (output.weight, else
                                 # token_embd.weight when the output is tied to the embeddings)
    block_bytes: int = 0         # bytes of the repeating layers' tensors: what a decode step
    output_bytes: int = 0        # reads of the weights, with the output matrix's


# ------------------------------------------------------------------ limits

MAX_TENSORS = 1_000_000
MAX_METADATA_KEYS = 100_000
MAX_KEY_BYTES = 64 * 1024            # metadata keys and tensor names
MAX_STRING_VALUE_BYTES = 64 << 20    # one metadata string value
MAX_ARRAY_ELEMENTS = 1 << 30         # same bound as llama.cpp (GGUF_MAX_ARRAY_ELEMENTS)
MAX_ARRAY_DEPTH = 2                  # an array of arrays of scalars/strings, no deeper
MAX_DIMS = 4                         # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 62               # per tensor
MAX_ALIGNMENT = 65536
DEFAULT_ALIGNMENT = 32
MAX_ARCH_BYTES = 128

_HEADER_BYTES = 24
# Smallest possible entries, used to refuse counts that cannot fit in the file.
_MIN_KV_BYTES = 8 + 1 + 4 + 1            # key length, 1-byte key, type, u8 value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, 1-byte name, n_dims, 1 dim, type, offset

_WINDOW = 1 << 20
_WHOLE_ARRAY_BYTES = 64 << 20        # Metadata.strings reads an array this size at once

# ------------------------------------------------------------------ value types

_T_UINT8, _T_INT8, _T_UINT16, _T_INT16, _T_UINT32, _T_INT32 = 0, 1, 2, 3, 4, 5
_T_FLOAT32, _T_BOOL, _T_STRING, _T_ARRAY = 6, 7, 8, 9
_T_UINT64, _T_INT64, _T_FLOAT64 = 10, 11, 12

_TYPE_NAMES = {
    0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32",
    7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64",
}
_SCALAR_FORMATS = {
    _T_UINT8: "<B", _T_INT8: "<b", _T_UINT16: "<H", _T_INT16: "<h", _T_UINT32: "<I",
    _T_INT32: "<i", _T_FLOAT32: "<f", _T_BOOL: "<B", _T_UINT64: "<Q", _T_INT64: "<q",
    _T_FLOAT64: "<d",
}
_SCALARS = {t: struct.Struct(f) for t, f in _SCALAR_FORMATS.items()}
_INTEGER_TYPES = frozenset((_T_UINT8, _T_INT8, _T_UINT16, _T_INT16, _T_UINT32, _T_INT32,
                            _T_UINT64, _T_INT64))
# Minimum encoded size of one element of each type (strings: the length prefix;
# arrays: element type + count).
_MIN_ELEMENT_BYTES = {**{t: s.size for t, s in _SCALARS.items()}, _T_STRING: 8, _T_ARRAY: 12}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# ------------------------------------------------------------------ model facts

# llama.cpp architectures that are encoders / embedding models (src/llama-arch.cpp).
EMBEDDING_ARCHITECTURES = frozenset({
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2",
    "jina-bert-v3", "eurobert", "t5encoder", "gemma-embedding",
})

# general.file_type values: enum llama_ftype in llama.cpp's include/llama.h.
FILE_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}


@functools.cache
def _ggml_types() -> tuple[dict[int, str], dict[int, tuple[int, int]]]:
    """The ggml types' names, and (block size in elements, bytes per block) for every type we
    accept, from gguf-py's constants.py (standard library only; its package __init__ loads
    numpy, ~10 MB). Read at the first check, not at import: a daemon whose models are in its
    store checks none at start, and the module's hundreds of enum members cost it ~3 MB."""
    constants = module_from_package_file("gguf", "constants.py", "stackd_gguf_constants")
    names = {int(t): t.name for t in constants.GGMLQuantizationType}
    blocks = {int(t): (int(b), int(s)) for t, (b, s) in constants.GGML_QUANT_SIZES.items()}
    return names, blocks


_ARCH_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _q(text: str, limit: int = 120) -> str:
    """Quote a key or tensor name from the file for a message: escaped, and cut short."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


# ------------------------------------------------------------------ public API

def check_gguf(path: str, *, max_file_bytes: int = 1 << 40,
               extra_checks: tuple[Callable[["Metadata"], None], ...] = ()) -> GGUFInfo:
    """Check the GGUF file at ``path`` and describe it; raise GGUFError if it is refused.

    Each of ``extra_checks`` (e.g. the vocabulary rules of vocab_check.py) is called with a
    read-only view of the metadata once the structure is known to be sound."""
    fd = -1
    try:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise GGUFError(f"cannot open model file {os.fspath(path)!r}: {exc.strerror or exc}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError(f"model file {os.fspath(path)!r} is not a regular file")
        size = st.st_size
        if size > max_file_bytes:
            raise GGUFError(f"file is {size} bytes, over the limit of {max_file_bytes} bytes")
        parser = _Parser(_Source(fd, size))
        info = parser.parse()
        for check in extra_checks:
            check(Metadata(parser))
        return info
    except GGUFError:
        raise
    except MemoryError:
        raise GGUFError("malformed GGUF file: ran out of memory while checking it") from None
    except Exception as exc:  # struct.error, IndexError, UnicodeDecodeError, OverflowError, OSError...
        raise GGUFError(f"malformed GGUF file: {type(exc).__name__}: {exc}") from exc
    finally:
        if fd >= 0:
            os.close(fd)


# ------------------------------------------------------------------ reading

class _Source:
    """Bounded reads of a file through a window; every read is checked against the size."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._buf = b""
        self._start = 0

    def view(self, offset: int, n: int, what: str) -> tuple[bytes, int]:
        """Return (buf, i) with buf[i:i + n] the file's bytes at ``offset``."""
        if n == 0 and 0 <= offset <= self.size:
            return b"", 0
        if n < 0 or offset < 0 or offset + n > self.size:
            raise GGUFError(f"file truncated: {what} at byte offset {offset} needs {n} bytes, "
                            f"but the file ends at byte {self.size}")
        start = self._start
        if offset >= start and offset + n <= start + len(self._buf):
            return self._buf, offset - start
        want = min(max(n, _WINDOW), self.size - offset)
        chunks = []
        got = 0
        while got < want:
            chunk = os.pread(self.fd, want - got, offset + got)
            if not chunk:
                raise GGUFError(f"file changed while it was being checked: short read at byte offset "
                                f"{offset + got}")
            chunks.append(chunk)
            got += len(chunk)
        self._buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._start = offset
        return self._buf, 0

    def read(self, offset: int, n: int, what: str) -> bytes:
        buf, i = self.view(offset, n, what)
        return buf[i:i + n]


class _Str:
    """A metadata string value, located but not read."""
    __slots__ = ("offset", "length")

    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.length = offset, length


class _Arr:
    """A metadata array value, located but not read: its elements are at [offset, end)."""
    __slots__ = ("etype", "count", "offset", "end")

    def __init__(self, etype: int, count: int, offset: int) -> None:
        self.etype, self.count, self.offset, self.end = etype, count, offset, offset


class _Tensor:
    __slots__ = ("name", "n_dims", "ggml_type", "elements", "nbytes", "offset")

    def __init__(self, name: str, n_dims: int, ggml_type: int, elements: int, nbytes: int,
                 offset: int) -> None:
        self.name, self.n_dims, self.ggml_type = name, n_dims, ggml_type
        self.elements, self.nbytes, self.offset = elements, nbytes, offset


def _output_tensor(tensors: list[_Tensor]) -> _Tensor | None:
    by_name = {t.name: t for t in tensors}
    return by_name.get("output.weight", by_name.get("token_embd.weight"))


class _Parser:
    def __init__(self, src: _Source) -> None:
        self.src = src
        self.size = src.size
        self.pos = 0
        # key -> (value type, value): int/float/bool for scalars, _Str, _Arr.
        self.meta: dict[str, tuple[int, Any]] = {}

    # -- primitives

    def _u32(self, what: str) -> int:
        buf, i = self.src.view(self.pos, 4, what)
        self.pos += 4
        return _U32.unpack_from(buf, i)[0]

    def _u64(self, what: str) -> int:
        buf, i = self.src.view(self.pos, 8, what)
        self.pos += 8
        return _U64.unpack_from(buf, i)[0]

    def _string_length(self, cap: int, what: str) -> int:
        at = self.pos
        n = self._u64(f"length of {what}")
        if n > cap:
            raise GGUFError(f"string length {n} of {what} at byte offset {at} exceeds the "
                            f"{cap}-byte limit")
        if n > self.size - self.pos:
            raise GGUFError(f"string length {n} of {what} at byte offset {at} runs past the end "
                            f"of the {self.size}-byte file (truncated or corrupt)")
        return n

    def _name(self, what: str) -> str:
        """A key or tensor name: non-empty, at most MAX_KEY_BYTES, valid UTF-8."""
        at = self.pos
        n = self._string_length(MAX_KEY_BYTES, what)
        if n == 0:
            raise GGUFError(f"{what} at byte offset {at} is empty")
        raw = self.src.read(self.pos, n, what)
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{what} at byte offset {at} is not valid UTF-8") from None

    def _require_fit(self, count: int, element_bytes: int, what: str, at: int) -> None:
        if count > MAX_ARRAY_ELEMENTS:
            raise GGUFError(f"{what} at byte offset {at} has {count} elements, over the limit of "
                            f"{MAX_ARRAY_ELEMENTS}")
        if count * element_bytes > self.size - self.pos:
            raise GGUFError(f"{what} at byte offset {at} declares {count} elements, which cannot fit "
                            f"in the {self.size - self.pos} bytes left in the file (truncated or corrupt)")

    # -- file structure

    def parse(self) -> GGUFInfo:
        version, n_tensors, n_kv = self._header()
        for i in range(n_kv):
            self._kv(i)
        alignment = self._alignment()
        tensors = self._tensor_infos(n_tensors, alignment)
        data_bytes = self._tensor_data(tensors, alignment)
        return self._describe(version, tensors, data_bytes)

    def _header(self) -> tuple[int, int, int]:
        if self.size < 4:
            raise GGUFError(f"file truncated: {self.size} bytes is too short to be a GGUF file")
        magic = self.src.read(0, 4, "magic")
        if magic != b"GGUF":
            raise GGUFError(f"not a GGUF file: bad magic {magic!r} at byte offset 0 (expected b'GGUF')")
        self.pos = 4
        version = self._u32("version")
        if version not in (2, 3):
            if version & 0xFFFF == 0 and version:
                raise GGUFError(f"GGUF version field at byte offset 4 reads {version:#x}: the file looks "
                                f"big-endian, which is not supported")
            if version == 1:
                raise GGUFError("GGUF version 1 is obsolete and not supported (only versions 2 and 3)")
            raise GGUFError(f"unsupported GGUF version {version} at byte offset 4 (only versions 2 and 3)")
        n_tensors = self._u64("tensor count")
        n_kv = self._u64("metadata key count")
        if n_tensors > MAX_TENSORS:
            raise GGUFError(f"tensor count {n_tensors} at byte offset 8 is over the limit of {MAX_TENSORS}")
        if n_kv > MAX_METADATA_KEYS:
            raise GGUFError(f"metadata key count {n_kv} at byte offset 16 is over the limit of "
                            f"{MAX_METADATA_KEYS}")
        needed = _HEADER_BYTES + n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
        if needed > self.size:
            raise GGUFError(f"tensor count {n_tensors} and metadata key count {n_kv} need at least "
                            f"{needed} bytes, but the file is {self.size} bytes (truncated or corrupt)")
        return version, n_tensors, n_kv

    def _kv(self, index: int) -> None:
        at = self.pos
        key = self._name(f"metadata key #{index}")
        if key in self.meta:
            raise GGUFError(f"duplicate metadata key {_q(key)} at byte offset {at}")
        type_at = self.pos
        vtype = self._u32(f"value type of metadata key {_q(key)}")
        if vtype not in _TYPE_NAMES:
            raise GGUFError(f"metadata key {_q(key)} has unknown value type {vtype} at byte offset {type_at}")
        self.meta[key] = (vtype, self._value(vtype, key, 0))

    def _value(self, vtype: int, key: str, depth: int) -> Any:
        if vtype == _T_STRING:
            n = self._string_length(MAX_STRING_VALUE_BYTES, f"the value of metadata key {_q(key)}")
            value = _Str(self.pos, n)
            self.pos += n
            return value
        if vtype == _T_ARRAY:
            return self._array(key, depth + 1)
        codec = _SCALARS[vtype]
        buf, i = self.src.view(self.pos, codec.size, f"value of metadata key {_q(key)}")
        self.pos += codec.size
        return codec.unpack_from(buf, i)[0]

    def _array(self, key: str, depth: int) -> _Arr:
        at = self.pos
        etype = self._u32(f"array element type of metadata key {_q(key)}")
        count = self._u64(f"array length of metadata key {_q(key)}")
        what = f"array of metadata key {_q(key)}"
        if etype not in _TYPE_NAMES:
            raise GGUFError(f"{what} at byte offset {at} has unknown value type {etype} for its elements")
        if etype == _T_ARRAY and depth >= MAX_ARRAY_DEPTH:
            raise GGUFError(f"{what} at byte offset {at} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
        self._require_fit(count, _MIN_ELEMENT_BYTES[etype], what, at)
        value = _Arr(etype, count, self.pos)
        if etype == _T_STRING:
            self._skip_strings(count, key)
        elif etype == _T_ARRAY:
            for _ in range(count):
                self._array(key, depth + 1)
        else:
            self.pos += count * _SCALARS[etype].size  # fits: checked above
        value.end = self.pos
        return value

    def _skip_strings(self, count: int, key: str) -> None:
        """Walk an array of strings (e.g. a tokenizer vocabulary) without reading the text."""
        view, size, pos = self.src.view, self.size, self.pos
        what = f"string in the array of metadata key {_q(key)}"
        for _ in range(count):
            buf, i = view(pos, 8, what)
            n = _U64.unpack_from(buf, i)[0]
            if n > MAX_STRING_VALUE_BYTES:
                raise GGUFError(f"string length {n} of a {what} at byte offset {pos} exceeds the "
                                f"{MAX_STRING_VALUE_BYTES}-byte limit")
            pos += 8
            if n > size - pos:
                raise GGUFError(f"string length {n} of a {what} at byte offset {pos - 8} runs past the "
                                f"end of the {size}-byte file (truncated or corrupt)")
            pos += n
        self.pos = pos

    def _alignment(self) -> int:
        entry = self.meta.get("general.alignment")
        if entry is None:
            return DEFAULT_ALIGNMENT
        vtype, value = entry
        if vtype != _T_UINT32:
            raise GGUFError(f"general.alignment must be a uint32, not {_TYPE_NAMES[vtype]}")
        if not 1 <= value <= MAX_ALIGNMENT or value & (value - 1):
            raise GGUFError(f"general.alignment is {value}; it must be a power of two between 1 "
                            f"and {MAX_ALIGNMENT}")
        return value

    def _tensor_infos(self, n_tensors: int, alignment: int) -> list[_Tensor]:
        if n_tensors == 0:
            raise GGUFError("the file has no tensors, so it is not a usable model")
        tensors: list[_Tensor] = []
        seen: set[str] = set()
        type_names, blocks = _ggml_types()
        for index in range(n_tensors):
            at = self.pos
            name = self._name(f"tensor name #{index}")
            if name in seen:
                raise GGUFError(f"duplicate tensor name {_q(name)} at byte offset {at}")
            seen.add(name)
            label = f"tensor {_q(name)} (tensor info at byte offset {at})"
            n_dims = self._u32(f"dimension count of tensor {_q(name)}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(f"{label} has {n_dims} dimensions; it must have 1 to {MAX_DIMS}")
            buf, i = self.src.view(self.pos, 8 * n_dims, f"shape of tensor {_q(name)}")
            dims = struct.unpack_from(f"<{n_dims}Q", buf, i)
            self.pos += 8 * n_dims
            elements = 1
            for j, d in enumerate(dims):
                if d == 0:
                    raise GGUFError(f"{label} has a zero size in dimension {j}")
                if d >= 1 << 63:
                    raise GGUFError(f"{label} has size {d} in dimension {j}, which overflows int64")
                elements *= d
            if elements > MAX_ELEMENTS:
                raise GGUFError(f"{label} shape {list(dims)} has {elements} elements: element count "
                                f"overflow (limit 2^62)")
            type_at = self.pos
            ggml_type = self._u32(f"ggml type of tensor {_q(name)}")
            if ggml_type not in type_names:
                raise GGUFError(f"{label} has unknown ggml type {ggml_type} at byte offset {type_at}")
            if ggml_type not in blocks:
                raise GGUFError(f"{label} has unsupported ggml type {type_names[ggml_type]} "
                                f"({ggml_type}): its block size is unknown")
            block, block_bytes = blocks[ggml_type]
            if dims[0] % block:
                raise GGUFError(f"{label} of type {type_names[ggml_type]} has rows of {dims[0]} "
                                f"elements, not a multiple of the block size {block}")
            offset_at = self.pos
            offset = self._u64(f"data offset of tensor {_q(name)}")
            if offset % alignment:
                raise GGUFError(f"{label} has data offset {offset} (at byte offset {offset_at}) that is "
                                f"not aligned to {alignment} bytes")
            tensors.append(_Tensor(name, n_dims, ggml_type, elements, elements // block * block_bytes,
                                   offset))
        return tensors

    def _tensor_data(self, tensors: list[_Tensor], alignment: int) -> int:
        data_start = -(-self.pos // alignment) * alignment
        if data_start > self.size:
            raise GGUFError(f"file truncated: the tensor data section should start at byte {data_start}, "
                            f"but the file ends at byte {self.size}")
        total = 0
        for t in tensors:
            begin = data_start + t.offset
            end = begin + t.nbytes
            if end > self.size:
                raise GGUFError(f"tensor {_q(t.name)} data at bytes [{begin}, {end}) extends past the end "
                                f"of the {self.size}-byte file (truncated, or a bad offset)")
            total += t.nbytes
        ordered = sorted(tensors, key=lambda t: t.offset)
        for prev, cur in zip(ordered, ordered[1:]):
            if cur.offset < prev.offset + prev.nbytes:
                raise GGUFError(f"tensors {_q(prev.name)} and {_q(cur.name)} overlap in the data section "
                                f"(offsets {prev.offset} + {prev.nbytes} bytes and {cur.offset})")
        return total

    # -- metadata

    def _string(self, key: str, *, strict: bool = True) -> str | None:
        entry = self.meta.get(key)
        if entry is None:
            return None
        vtype, value = entry
        if vtype != _T_STRING:
            raise GGUFError(f"metadata key {_q(key)} must be a string, not {_TYPE_NAMES[vtype]}")
        raw = self.src.read(value.offset, value.length, f"value of metadata key {_q(key)}")
        try:
            return raw.decode("utf-8", "strict" if strict else "replace")
        except UnicodeDecodeError:
            raise GGUFError(f"metadata key {_q(key)} (string at byte offset {value.offset - 8}) is "
                            f"not valid UTF-8") from None

    def _integer(self, key: str) -> int | None:
        """An integer key; an array of integers (per-layer values) gives its maximum."""
        entry = self.meta.get(key)
        if entry is None:
            return None
        vtype, value = entry
        if vtype == _T_ARRAY and value.etype in _INTEGER_TYPES:
            values = self._int_array(key, value)
            result = max(values) if values else None
        elif vtype in _INTEGER_TYPES:
            result = value
        else:
            kind = _TYPE_NAMES[vtype]
            if vtype == _T_ARRAY:
                kind = f"array of {_TYPE_NAMES[value.etype]}"
            raise GGUFError(f"metadata key {_q(key)} must be an integer, not {kind}")
        if result is not None and result < 0:
            raise GGUFError(f"metadata key {_q(key)} is negative ({result})")
        return result

    def _int_array(self, key: str, arr: _Arr) -> list[int]:
        if arr.count > 1 << 20:
            raise GGUFError(f"metadata key {_q(key)} is an array of {arr.count} integers; too many")
        codec = _SCALARS[arr.etype]
        n = arr.count * codec.size
        raw = self.src.read(arr.offset, n, f"array of metadata key {_q(key)}")
        return list(struct.unpack(f"<{arr.count}{_SCALAR_FORMATS[arr.etype][1]}", raw))

    def _describe(self, version: int, tensors: list[_Tensor], data_bytes: int) -> GGUFInfo:
        arch = self._string("general.architecture")
        if arch is None:
            raise GGUFError("required metadata key 'general.architecture' is missing")
        if not arch or len(arch) > MAX_ARCH_BYTES or not set(arch) <= _ARCH_CHARS:
            raise GGUFError(f"general.architecture {arch[:MAX_ARCH_BYTES]!r} is not a valid "
                            f"architecture name")
        entry = self.meta.get("general.name")
        name = self._string("general.name", strict=False) if entry is not None and entry[0] == _T_STRING else None

        pooling = self._integer(f"{arch}.pooling_type")
        kind = "embedding" if arch in EMBEDDING_ARCHITECTURES or pooling else "chat"

        head_count = self._integer(f"{arch}.attention.head_count")
        output = _output_tensor(tensors)
        head_count_kv = self._integer(f"{arch}.attention.head_count_kv")
        if head_count_kv is None:
            head_count_kv = head_count

        return GGUFInfo(
            version=version,
            architecture=arch,
            name=name,
            kind=kind,
            quantization=self._quantization(tensors),
            parameter_count=sum(t.elements for t in tensors),
            context_length=self._integer(f"{arch}.context_length"),
            embedding_length=self._integer(f"{arch}.embedding_length"),
            block_count=self._integer(f"{arch}.block_count"),
            head_count_kv=head_count_kv,
            head_count=head_count,
            tensor_count=len(tensors),
            tensor_data_bytes=data_bytes,
            file_size=self.size,
            block_elements=sum(t.elements for t in tensors if t.name.startswith("blk.")),
            output_elements=output.elements if output else 0,
            block_bytes=sum(t.nbytes for t in tensors if t.name.startswith("blk.")),
            output_bytes=output.nbytes if output else 0,
        )

    def _quantization(self, tensors: list[_Tensor]) -> str:
        entry = self.meta.get("general.file_type")
        if entry is not None and entry[0] in _INTEGER_TYPES and entry[1] in FILE_TYPE_NAMES:
            return FILE_TYPE_NAMES[entry[1]]
        # No (or an unknown / "guessed") file type: the commonest type of the 2-D weights.
        pool = [t for t in tensors if t.n_dims == 2] or tensors
        most_common = Counter(t.ggml_type for t in pool).most_common(1)[0][0]
        return _ggml_types()[0][most_common]


class Metadata:
    """Typed, bounded reads of the metadata of a file that passed the structural check."""

    def __init__(self, parser: _Parser) -> None:
        self._p = parser

    def type_name(self, key: str) -> str | None:
        """"string", "uint32", "array of string", ... or None when the key is absent."""
        entry = self._p.meta.get(key)
        if entry is None:
            return None
        vtype, value = entry
        return f"array of {_TYPE_NAMES[value.etype]}" if vtype == _T_ARRAY else _TYPE_NAMES[vtype]

    def string(self, key: str) -> str | None:
        return self._p._string(key, strict=False)

    def integer(self, key: str) -> int | None:
        return self._p._integer(key)

    def scalar(self, key: str) -> int | float | None:
        """A number or bool key's value as stored (None when absent or not a scalar)."""
        entry = self._p.meta.get(key)
        return entry[1] if entry is not None and entry[0] in _SCALARS else None

    def count(self, key: str) -> int:
        """Elements of an array key (0 for anything else)."""
        entry = self._p.meta.get(key)
        return entry[1].count if entry is not None and entry[0] == _T_ARRAY else 0

    def strings(self, key: str) -> Iterator[bytes]:
        """The elements of an array of strings, as raw bytes (already bounds-checked)."""
        vtype, arr = self._p.meta[key]
        if vtype != _T_ARRAY or arr.etype != _T_STRING:
            raise GGUFError(f"metadata key {_q(key)} must be an array of strings")
        if arr.end - arr.offset <= _WHOLE_ARRAY_BYTES:      # one read: a vocabulary is a few MB
            raw, base = self._p.src.read(arr.offset, arr.end - arr.offset, key), arr.offset
            view = lambda at, n, what: (raw, at - base)             # noqa: E731
        else:                                                     # larger: through the window
            view = self._p.src.view
        pos = arr.offset
        for _ in range(arr.count):
            buf, i = view(pos, 8, key)
            n = _U64.unpack_from(buf, i)[0]
            buf, i = view(pos + 8, n, key)
            yield buf[i:i + n]
            pos += 8 + n

    def raw_array(self, key: str) -> bytes:
        """The bytes of an array of fixed-size scalars."""
        vtype, arr = self._p.meta[key]
        if vtype != _T_ARRAY or arr.etype not in _SCALARS:
            raise GGUFError(f"metadata key {_q(key)} must be an array of numbers")
        return self._p.src.read(arr.offset, arr.count * _SCALARS[arr.etype].size, key)
