"""Giving back the heap a start-up used.

Loading a model (and, in the daemon, a vocabulary) allocates and frees a lot of small
buffers; glibc keeps the freed pages in its arenas, resident and counted in the process's
memory until reused. On a device that memory is the budget (the engine-worker issue caps the
whole process tree at llama-server's + 50 MB), so once loading is done the free pages go back
to the kernel. No-op without glibc.
"""
from __future__ import annotations

import ctypes


def release_free_heap() -> None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except AttributeError:                     # not glibc
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
