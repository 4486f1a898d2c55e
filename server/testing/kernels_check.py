"""The kernels' test-only library (kernels/src/check.cpp, built beside the product's into
build/kernels/ of a checkout): our MUL_MAT against ggml's CPU backend on the same random
weights, the GET_ROWS check, the op timer, and whether our device takes an op. Used by
tests/kernels and bench/kernels_ops.py."""
from __future__ import annotations

import ctypes
import functools
import os

from ..engine import accel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(ROOT, "build", "kernels", "libstackd_kernels_check.so")


@functools.cache
def library() -> ctypes.CDLL:
    accel.library()              # ggml first, bound the way the product binds it
    lib = ctypes.CDLL(LIBRARY)
    lib.stackd_kernels_check.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 3 + [
        ctypes.c_int, ctypes.c_uint32, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    lib.stackd_kernels_time.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 3 + [
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    lib.stackd_kernels_check_get_rows.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_uint32, ctypes.c_int]
    lib.stackd_kernels_accepts.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 3 + [ctypes.c_int]
    return lib
