"""The native parts build for aarch64 (Debian's cross toolchain, g++-aarch64-linux-gnu): the
engine, the chat formats and our kernels, against llama.cpp's headers (CMakeLists.txt,
STACKD_LLAMA_HEADERS_ONLY). An aarch64 build compiles the kernels' NEON files and none of
their x86 ones (tests/kernels/test_aarch64.py runs the NEON paths under qemu)."""
import fcntl
import functools
import os
import shutil
import struct
import subprocess
import sys
import sysconfig

import pybind11
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.cross,
              pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                                 reason="g++-aarch64-linux-gnu missing (make test-deps installs it)")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build", "cross-aarch64")
TARGETS = {"stackd_kernels": "kernels/libstackd_kernels.so", "_engine": None, "_chat": None}
EM_AARCH64 = 183
X86_SIMD_SOURCES = ("gemm_avx2", "gemm_avx512", "gemm_qk_avx2", "gemm_qk_avx512",
                    "attention_avx2", "attention_avx512", "candidates_scan_x86", "quantize_x86")
NEON_SOURCES = ("gemm_neon.", "gemm_neon_i8mm.", "gemm_qk_neon.", "attention_neon.", "candidates_scan_neon.")


def machine(path: str) -> int:
    with open(path, "rb") as f:
        header = f.read(20)
    assert header[:4] == b"\x7fELF", path
    return struct.unpack_from("<H", header, 18)[0]


@functools.cache
def cross_build() -> str:
    """Configure and build (incrementally: build/cross-aarch64 stays) under the tree's build
    lock, as every native build in this checkout."""
    with open("/tmp/stackd-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        configure = ["cmake", "-S", ROOT, "-B", BUILD, "-G", "Unix Makefiles",
                     f"-DCMAKE_TOOLCHAIN_FILE={ROOT}/packaging/cross/aarch64-linux-gnu.cmake",
                     "-DSTACKD_LLAMA_HEADERS_ONLY=ON", "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}",
                     f"-DPython_INCLUDE_DIR={sysconfig.get_paths()['include']}",
                     f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]
        done = subprocess.run(configure, capture_output=True, text=True)
        if done.returncode != 0:
            return done
        done = subprocess.run(["nice", "-n", "10", "cmake", "--build", BUILD, "--parallel",
                               str(os.cpu_count() or 2), "--target", *TARGETS],
                              capture_output=True, text=True)
    return done


def build() -> str:
    done = cross_build()
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return BUILD


def test_the_native_modules_are_aarch64():
    cross_build = build()
    built = [os.path.join(cross_build, name) for name in os.listdir(cross_build)
             if name.startswith(("_engine.", "_chat.")) and name.endswith(".so")]
    built.append(os.path.join(cross_build, TARGETS["stackd_kernels"]))
    assert len(built) == 3, built
    assert {path: machine(path) for path in built} == {path: EM_AARCH64 for path in built}


def test_the_neon_files_and_no_x86_simd_file_are_compiled():
    cross_build = build()
    objects = [name for _, _, files in os.walk(os.path.join(cross_build, "kernels")) for name in files
               if name.endswith(".o")]
    assert any(name.startswith("gemm_scalar") for name in objects)
    assert [name for name in objects if name.startswith(X86_SIMD_SOURCES)] == []
    assert sorted(prefix for prefix in NEON_SOURCES if any(name.startswith(prefix) for name in objects)) == \
        sorted(NEON_SOURCES)
