"""This node's measured compute, for a layer split's counts (placement.py: `NodeOffer.compute`).

One short benchmark per daemon: a decode-shaped matmul (a Q4_1 weight of MATRIX x MATRIX, the
default models' type, times BATCH columns, about a 16-slot step) through ggml's CPU kernels
on the node's engine threads, the best of ROUNDS, in GFLOP/s. It runs in a child process
(`python -m stackd.cluster.compute_speed THREADS`), so the daemon never loads ggml for it and a
failure costs only the figure, and in a thread of the daemon, so start-up does not wait:
until it answers the node reports 0 (not measured), and placement falls back to memory.
A daemon starting competes with itself (its default models loading) and with whatever else
runs, which only ever makes a figure lower: the node measures MEASUREMENTS times, MEASURE_EVERY
apart, and keeps the highest (on this busy 2-core machine one node's first figures ranged
4.3-11.4).

The figure is relative: nodes compare theirs, the unit matters only in being shared. A
weight larger than a cache makes it follow memory bandwidth as a decode step does; the
power contract's compute scale is applied by whoever reads it (not measured into it).
A test harness's `compute` (server/faults.py) replaces the measurement.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import logging
import os
import subprocess
import sys
import threading
import time

log = logging.getLogger("stackd.cluster")

MATRIX = 4096            # a 4096 x 4096 Q4_1 weight: 9 MiB, past a core's caches
BATCH = 16               # columns: a step of 16 slots
ROUNDS = 5               # the best of these (a busy machine's rounds only get slower)
CHILD_TIMEOUT = 60.0     # seconds for the child's answer; past it, the node stays unmeasured
MEASUREMENTS = 3         # at start, then again: the highest figure stands
MEASURE_EVERY = 20.0     # seconds between them
GGML_TYPE_Q4_1, GGML_TYPE_F32 = 3, 0


class ComputeSpeed:
    """The node's figure: 0.0 until measured (or when measuring failed), then GFLOP/s."""

    def __init__(self, threads: int, fixed: float | None = None):
        self.threads = max(1, threads)
        self.value = fixed if fixed is not None else 0.0
        self._fixed = fixed is not None

    def start(self) -> None:
        """Measure in the background (nothing to do when a test configuration fixed it)."""
        if not self._fixed:
            threading.Thread(target=self._measure, name="compute-speed", daemon=True).start()

    def _measure(self) -> None:
        for n in range(MEASUREMENTS):
            if n:
                time.sleep(MEASURE_EVERY)
            self.value = max(self.value, measure_in_child(self.threads))
        if self.value > 0:
            log.info("cluster: this node computes %.1f GFLOP/s on %d thread(s)", self.value, self.threads)


def measure_in_child(threads: int) -> float:
    try:
        done = subprocess.run([sys.executable, "-m", "stackd.cluster.compute_speed", str(threads)],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=True)
        return max(0.0, float(done.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        log.warning("cluster: measuring this node's compute failed (%s); layer splits follow memory", exc)
        return 0.0


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """ggml and its CPU backend, from where llama.cpp's Python package loads them."""
    spec = importlib.util.find_spec("llama_cpp")      # found, not imported: ggml alone is needed
    lib_dir = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))
    cpu = ctypes.CDLL(cpu_library(lib_dir))
    base.ggml_init.argtypes, base.ggml_init.restype = [_InitParams], ctypes.c_void_p
    base.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_new_tensor_2d.restype = ctypes.c_void_p
    base.ggml_mul_mat.argtypes, base.ggml_mul_mat.restype = [ctypes.c_void_p] * 3, ctypes.c_void_p
    base.ggml_new_graph.argtypes, base.ggml_new_graph.restype = [ctypes.c_void_p], ctypes.c_void_p
    base.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    base.ggml_get_data.argtypes, base.ggml_get_data.restype = [ctypes.c_void_p], ctypes.c_void_p
    base.ggml_nbytes.argtypes, base.ggml_nbytes.restype = [ctypes.c_void_p], ctypes.c_size_t
    base.ggml_graph_overhead.restype = ctypes.c_size_t
    base.ggml_free.argtypes = [ctypes.c_void_p]
    cpu.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return base, cpu


def cpu_library(lib_dir: str) -> str:
    """ggml's CPU backend: the one library of a build for this machine, or, in a portable build
    (GGML_CPU_ALL_VARIANTS: libggml-cpu-haswell.so, -icelake, ...), the variant that scores
    highest here, as ggml's own loader picks it (a variant this CPU cannot run scores 0)."""
    single = os.path.join(lib_dir, "libggml-cpu.so")
    if os.path.exists(single):
        return single
    ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))    # what each variant links to
    best, best_score = None, 0
    for path in sorted(glob.glob(os.path.join(lib_dir, "libggml-cpu-*.so"))):
        score = getattr(ctypes.CDLL(path), "ggml_backend_score", None)
        if score is None:
            continue
        score.restype = ctypes.c_int
        here = score()
        if here > best_score:
            best, best_score = path, here
    if best is None:
        raise OSError(f"no CPU backend of ggml runs on this machine in {lib_dir}")
    return best


def measure(threads: int) -> float:
    """GFLOP/s of the decode-shaped matmul on `threads` threads, the best of ROUNDS."""
    base, cpu = _ggml()
    size = MATRIX * MATRIX + 8 * MATRIX * BATCH * 4 + base.ggml_graph_overhead() + (16 << 20)
    ctx = base.ggml_init(_InitParams(size, None, False))
    if not ctx:
        raise MemoryError("ggml_init failed")
    try:
        weight = base.ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_1, MATRIX, MATRIX)
        columns = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, MATRIX, BATCH)
        for tensor in (weight, columns):     # zeros: no denormals or NaNs to slow a round
            ctypes.memset(base.ggml_get_data(tensor), 0, base.ggml_nbytes(tensor))
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, base.ggml_mul_mat(ctx, weight, columns))
        cpu.ggml_graph_compute_with_ctx(ctx, graph, threads)     # warms the pages and threads
        best = float("inf")
        for _ in range(ROUNDS):
            started = time.perf_counter()
            cpu.ggml_graph_compute_with_ctx(ctx, graph, threads)
            best = min(best, time.perf_counter() - started)
        return 2.0 * MATRIX * MATRIX * BATCH / best / 1e9
    finally:
        base.ggml_free(ctx)


if __name__ == "__main__":
    print(f"{measure(int(sys.argv[1]) if len(sys.argv) > 1 else 1):.3f}")
