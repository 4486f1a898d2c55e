"""GGUF bytes built by hand, so a fuzz target can say anything a file can: wrong types,
odd counts, keys twice. (gguf.GGUFWriter refuses much of that before it writes.)"""
from __future__ import annotations

import struct

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
SCALAR_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
                  FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
F32 = 0                                    # ggml type of the one tensor


def string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def value(vtype: int, v) -> bytes:
    """v: bytes for STRING, (element type, [values]) for ARRAY, a number otherwise."""
    if vtype == STRING:
        return string(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, item) for item in items)
    return struct.pack(SCALAR_FORMATS[vtype], v)


def gguf(kvs: list[tuple[bytes, int, object]], *, rows: int = 4) -> bytes:
    """A GGUF v3 file with these (key, type, value) metadata entries and one F32 tensor."""
    out = [b"GGUF", struct.pack("<IQQ", 3, 1, len(kvs))]
    for key, vtype, v in kvs:
        out += [string(key), struct.pack("<I", vtype), value(vtype, v)]
    out += [string(b"token_embd.weight"), struct.pack("<I", 2), struct.pack("<QQ", 8, rows),
            struct.pack("<I", F32), struct.pack("<Q", 0)]
    head = b"".join(out)
    head += b"\0" * (-len(head) % 32)
    return head + b"\0" * (8 * rows * 4)
