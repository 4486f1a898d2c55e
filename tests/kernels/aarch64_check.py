"""Builds kernels/check/paths_check.cpp for aarch64 with Debian's cross compiler and runs it under
qemu-aarch64 (user mode: the program's instructions emulated, the system calls the host's).

The program links the kernels' own sources and no ggml library (kernels/check/ggml_fp16.cpp
gives ggml's two fp16 conversions from ggml's header), so nothing of llama.cpp is cross-built:
only its headers are read, from the sdist kernels/fetch_ggml_source.py fetches into build/.
Compiled with the product's flags for these files (kernels/CMakeLists.txt: -O2 as Release's
-O3 or not does not change an IEEE operation, -ffp-contract=off, no -march: each NEON file sets
its own target), cached under build/aarch64-check/ by a digest of the sources and flags.
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "kernels", "src")
CHECK = os.path.join(ROOT, "kernels", "check")
BUILD = os.path.join(ROOT, "build", "aarch64-check")
CXX = "aarch64-linux-gnu-g++"
SYSROOT = "/usr/aarch64-linux-gnu"
# The kernel sources the check needs: each format's layout, the quantizers, every path's bodies.
SOURCES = [os.path.join(SRC, name + ".cpp") for name in (
    "cpu_features", "layout", "layout_qk", "quantize", "gemm_scalar", "gemm_qk_scalar", "gemm_neon",
    "gemm_neon_i8mm", "gemm_qk_neon", "attention_scalar", "attention_neon", "candidates_scan",
    "candidates_scan_neon")] + [os.path.join(CHECK, "ggml_fp16.cpp"), os.path.join(CHECK, "paths_check.cpp")]
FLAGS = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror", "-ffp-contract=off"]
# qemu's CPU models: the Raspberry Pi 5 / RK3588 core (dotprod, no i8mm), everything qemu has
# (i8mm, SVE), and one without the dot products (an A53: a Pi 3's, many a cheap board's).
CPUS = {"cortex-a76": "neon-dotprod", "max": "neon-i8mm", "cortex-a53": "scalar"}


def qemu() -> str | None:
    return shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")


def missing() -> str | None:
    """Why the check cannot run here, or None."""
    if shutil.which(CXX) is None:
        return "g++-aarch64-linux-gnu missing (make test-deps installs it)"
    if qemu() is None:
        return "qemu-user-static missing (make test-deps installs it)"
    return None


def ggml_dir() -> str:
    """ggml's headers, from the llama.cpp source the kernels build against (fetched once)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "kernels", "fetch_ggml_source.py"),
                           os.path.join(ROOT, "build", "ggml-src")], capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def build() -> str:
    """The program's path, built if its sources or flags changed (under the tree's build lock)."""
    ggml = ggml_dir()
    include = ["-I", SRC, "-I", os.path.join(ggml, "include"), "-I", os.path.join(ggml, "src")]
    digest = hashlib.sha256(" ".join([CXX] + FLAGS).encode())
    for path in SOURCES + sorted(glob.glob(os.path.join(SRC, "*.h"))):
        with open(path, "rb") as f:
            digest.update(path.encode() + b"\0" + f.read())
    out = os.path.join(BUILD, digest.hexdigest()[:16])
    program = os.path.join(out, "paths_check")
    with open("/tmp/stackd-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(program):
            return program
        os.makedirs(out, exist_ok=True)

        def compile_one(source: str) -> str:
            obj = os.path.join(out, os.path.basename(source)[:-4] + ".o")
            done = subprocess.run(["nice", "-n", "10", CXX, *FLAGS, *include, "-c", source, "-o", obj],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{CXX} {source}:\n{done.stderr[-4000:]}")
            return obj

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:   # 2 cores, shared
            objects = list(pool.map(compile_one, SOURCES))
        subprocess.run([CXX, "-o", program + ".tmp", *objects], check=True, capture_output=True)
        os.replace(program + ".tmp", program)
    return program


def run(program: str, cpu: str, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """The program under qemu-aarch64 with that CPU model (no binfmt_misc needed)."""
    return subprocess.run([qemu(), "-L", SYSROOT, "-cpu", cpu, program, *args],
                          capture_output=True, text=True, timeout=timeout)
