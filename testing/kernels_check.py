"""The kernels' test-only library (libstackd_kernels_check.so, kernels/check/check.cpp, built into
build/kernels/ of a checkout and not part of the package), loaded with ctypes for tests/kernels
and bench/kernels_ops.py.

It holds its own copy of the kernels and makes its own backends (by path, beside whatever
stackd.engine.accel registered), so the product's library exports only what registering
needs. Paths are named as accel.PATHS, weight types by name.
"""
from __future__ import annotations

import ctypes
import os

from stackd.engine import accel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the checkout
LIBRARY = os.path.join(ROOT, "build", "kernels", "libstackd_kernels_check.so")
GGML_TYPE = {"f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_K": 12, "q5_K": 13, "q6_K": 14,
             "bf16": 30}
OPS = {"mul_mat": 0, "mul_mat_id": 1, "get_rows": 2}  # stackd_kernels_accepts' op numbers

_lib: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The loaded library, with its C signatures declared."""
    global _lib
    if _lib is None:
        accel.library()              # ggml first, bound the way the product binds it
        lib = ctypes.CDLL(LIBRARY)
        lib.stackd_kernels_check.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 3 + [
            ctypes.c_int, ctypes.c_uint32, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        lib.stackd_kernels_check_chunked.argtypes = lib.stackd_kernels_check.argtypes
        lib.stackd_kernels_run_for.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.stackd_kernels_run_for.restype = ctypes.c_int64
        lib.stackd_kernels_time.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 3 + [
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        lib.stackd_kernels_time_ggml_repacked.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 3 + [
            ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        lib.stackd_kernels_check_get_rows.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 3 + [ctypes.c_uint32, ctypes.c_int]
        lib.stackd_kernels_quantize_k_matches.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_int64]
        lib.stackd_kernels_accepts.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 3 + [ctypes.c_int]
        lib.stackd_kernels_get_rows_nodes.restype = ctypes.c_uint64
        lib.stackd_kernels_check_attention.argtypes = [ctypes.c_int64] * 7 + [
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint32, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        lib.stackd_kernels_time_attention.argtypes = [ctypes.c_int64] * 6 + [ctypes.c_int] * 4 + [
            ctypes.POINTER(ctypes.c_double)]
        lib.stackd_kernels_read_bandwidth.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                                                       ctypes.POINTER(ctypes.c_double)]
        lib.stackd_kernels_time_nodes.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                   ctypes.POINTER(ctypes.c_double)]
        _lib = lib
    return _lib


def check_mul_mat(type_name: str, k: int, rows: int, tokens: int, path: str, seed: int = 1,
                  n_threads: int = 2) -> list[float] | None:
    """Our MUL_MAT on `path` against ggml's CPU backend (check.cpp names the five results), or
    None if this CPU cannot run the path."""
    result = (ctypes.c_double * 5)()
    rc = library().stackd_kernels_check(GGML_TYPE[type_name], k, rows, tokens, accel.PATHS.index(path),
                                        seed, n_threads, result)
    return None if rc != 0 else list(result)


def check_chunked(type_name: str, k: int, rows: int, tokens: int, path: str, seed: int = 1,
                  n_threads: int = 2) -> list[float] | None:
    """check_mul_mat's five results for a product in the kernels' chunked form (a weight named
    as ffn_down; kernels.h, GemmOut), then: whether it differs from the plain form's output
    somewhere, whether it equals it bit for bit. None if this CPU cannot run the path."""
    result = (ctypes.c_double * 7)()
    rc = library().stackd_kernels_check_chunked(GGML_TYPE[type_name], k, rows, tokens, accel.PATHS.index(path),
                                                seed, n_threads, result)
    return None if rc != 0 else list(result)


def run_for(attn_output: bool, k: int) -> int:
    """The run backend.cpp gives a whole attn_output or ffn_down weight of K k."""
    return library().stackd_kernels_run_for(int(attn_output), k)


def time_mul_mat(type_name: str, k: int, rows: int, tokens: int, path: str, n_threads: int,
                 repeat: int) -> tuple[float, float] | None:
    """Seconds per MUL_MAT, best of `repeat`: (ggml's CPU backend, ours on `path`), or None if
    this CPU cannot run the path."""
    times = (ctypes.c_double * 2)()
    rc = library().stackd_kernels_time(GGML_TYPE[type_name], k, rows, tokens, accel.PATHS.index(path),
                                       n_threads, repeat, times)
    return None if rc != 0 else (times[0], times[1])


def read_bandwidth(n_bytes: int, n_threads: int, repeat: int) -> float:
    """Bytes a second `n_threads` OpenMP threads read from a buffer of `n_bytes` (make it far
    larger than the last-level cache), best of `repeat` passes: the memory roof of
    bench/roofline.py."""
    value = ctypes.c_double()
    library().stackd_kernels_read_bandwidth(n_bytes, n_threads, repeat, ctypes.byref(value))
    return value.value


def time_nodes(n_nodes: int, n_threads: int, repeat: int) -> float:
    """Seconds a node of ggml's CPU backend costs with `n_threads` whatever its work (its dispatch
    and the barrier after it), from a chain of `n_nodes` tiny additions, best of `repeat` graphs."""
    value = ctypes.c_double()
    library().stackd_kernels_time_nodes(n_nodes, n_threads, repeat, ctypes.byref(value))
    return value.value


def time_ggml_repacked(type_name: str, k: int, rows: int, tokens: int, n_threads: int, repeat: int) -> float | None:
    """Seconds per MUL_MAT, best of `repeat`, on ggml's CPU backend with the weight in ggml's own
    repacked buffer (CPU_REPACK, what llama.cpp's loader uses); None when ggml does not repack
    this type or shape on this CPU."""
    seconds = ctypes.c_double()
    rc = library().stackd_kernels_time_ggml_repacked(GGML_TYPE[type_name], k, rows, tokens, n_threads, repeat,
                                                     ctypes.byref(seconds))
    return None if rc != 0 else seconds.value


def get_rows_equals_ggml(k: int, rows: int, n_ids: int, seed: int, n_threads: int,
                        type_name: str = "q8_0") -> bool:
    """GET_ROWS on a repacked table (Q8_0, Q4_K, Q6_K) equals ggml's, float for float."""
    return library().stackd_kernels_check_get_rows(GGML_TYPE[type_name], k, rows, n_ids, seed, n_threads) == 1


def check_attention(dk: int, dv: int, n_kv: int, tokens: int, n_head: int, n_head_kv: int, n_streams: int,
                    path: str, seed: int = 1, n_threads: int = 2, kv_type: str = "f16",
                    heads_in_row: bool = True) -> list[float] | None:
    """Our decode attention (one FLASH_ATTN_EXT shaped as llama.cpp's per-sequence KV streams
    build it, its cache of `kv_type`; heads_in_row: a cell's K/V heads side by side, as llama.cpp's
    cache holds them, else each head's cells contiguous) on `path` against the exact result and
    ggml's per-row path (check.cpp names the five results), or None if this CPU cannot run the path."""
    result = (ctypes.c_double * 5)()
    rc = library().stackd_kernels_check_attention(dk, dv, n_kv, tokens, n_head, n_head_kv, n_streams,
                                                  GGML_TYPE[kv_type], int(heads_in_row), accel.PATHS.index(path),
                                                  seed, n_threads, result)
    return None if rc != 0 else list(result)


def time_attention(head_size: int, n_kv: int, tokens: int, n_head: int, n_head_kv: int, n_streams: int,
                   path: str, n_threads: int, repeat: int, kv_type: str = "f16") -> tuple[float, float] | None:
    """Seconds per FLASH_ATTN_EXT of a decode step, best of `repeat`: (ggml's per-row path, ours
    on `path`), or None if this CPU cannot run the path."""
    times = (ctypes.c_double * 2)()
    rc = library().stackd_kernels_time_attention(head_size, n_kv, tokens, n_head, n_head_kv, n_streams,
                                                 GGML_TYPE[kv_type], accel.PATHS.index(path), n_threads, repeat,
                                                 times)
    return None if rc != 0 else (times[0], times[1])


def accepts(type_name: str, shape: tuple[int, int, int], op: str) -> bool:
    """Whether our device takes a weight of this type and shape for `op`, asked as llama.cpp's
    loader asks."""
    return bool(library().stackd_kernels_accepts(GGML_TYPE[type_name], *shape, OPS[op]))


def quantize_k_matches_reference(row) -> bool:
    """Whether the K-quant activation quantizer this CPU runs gives the scalar reference's bytes
    for `row`, a contiguous float32 numpy array of a multiple of 256 values."""
    if row.dtype.name != "float32" or not row.flags.c_contiguous or row.size % 256:
        raise ValueError("a contiguous float32 row of a multiple of 256 values")
    pointer = row.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    return bool(library().stackd_kernels_quantize_k_matches(pointer, row.size))


def best_path() -> str:
    return accel.PATHS[library().stackd_kernels_best_path()]


def get_rows_nodes() -> int:
    """GET_ROWS nodes the device registered in this process has computed (tables of ours)."""
    return library().stackd_kernels_get_rows_nodes()
