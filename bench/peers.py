"""The peers the benchmarks compare against, built or installed once and cached.

* llama-server: llama.cpp's own server, built from the llama.cpp source inside
  llama-cpp-python's source distribution (the same version this project runs), with
  the same CPU flags as our wheel (native/llama_wheel.py), into .wheelhouse/.
* llama-batched-bench: llama.cpp's batched decode benchmark (no HTTP, no sampling), built
  the same way from the same source, beside llama-server.
* rpc-server: ggml's RPC server, for llama-server --rpc in the cluster benchmark.
* llama-quantize: llama.cpp's quantizer, built the same way but on its own into build/ (the
  tests make a Q4_K_M file with it: testing.quantized_model).
* an AVX2-only llama.cpp (`avx2_tree`): the same source built as shared libraries and tools
  with AVX-512 off, into build/peers-avx2/. The benches' `--cpu avx2` runs the peer from it
  and our engine on its libraries (LD_LIBRARY_PATH, LLAMA_CPP_LIB_PATH): what an AVX2-only CPU
  runs, on both sides, at this machine's clocks and caches.
* llama-cpp-python's server: the same wheel we run, plus its [server] extras, in a
  separate virtual environment (.wheelhouse/bench-venv) so they stay out of ours.

    python bench/peers.py        # builds both if needed; prints their paths
"""
from __future__ import annotations

import glob
import os
import runpy
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a build tool, not a package module: loaded from its file
llama_wheel = types.SimpleNamespace(**runpy.run_path(os.path.join(ROOT, "native", "llama_wheel.py")))

SERVER_EXTRAS = ["uvicorn==0.54.0", "fastapi", "sse-starlette", "starlette-context",
                 "pydantic-settings", "pyyaml"]


def _sdist(tmp: str) -> str:
    # The kernels build (kernels/fetch_ggml_source.py) already fetched this very sdist.
    fetched = os.path.join(ROOT, "build", "ggml-src", f"llama_cpp_python-{llama_wheel.VERSION}.tar.gz")
    if os.path.exists(fetched):
        return fetched
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                    "--disable-pip-version-check", "-d", tmp,
                    f"llama-cpp-python=={llama_wheel.VERSION}"], check=True, stdout=sys.stderr)
    return glob.glob(os.path.join(tmp, "llama_cpp_python-*.tar.gz"))[0]


def llama_server() -> str:
    return llama_cpp_tool("llama-server")


def llama_batched_bench() -> str:
    return llama_cpp_tool("llama-batched-bench")


# Built together: one configure and one compile of llama.cpp serves every peer tool.
# The CMake target of ggml's RPC server is ggml-rpc-server; we keep the name rpc-server.
TOOLS = {"llama-server": "llama-server", "llama-batched-bench": "llama-batched-bench",
         "rpc-server": "ggml-rpc-server"}
# A build that fails halfway keeps its objects here, so the next attempt resumes.
BUILD_DIR = os.path.join(ROOT, "build", "peers")


def llama_cpp_tool(tool: str) -> str:
    """A llama.cpp program built from the sdist's source with our wheel's CPU flags."""
    args = llama_wheel.cmake_args()
    out_dir = llama_wheel.wheel_dir(args).replace("llama-cpp-python-", "llama-server-")
    binary = os.path.join(out_dir, tool)
    if os.path.exists(binary):
        return binary
    os.makedirs(out_dir, exist_ok=True)
    source = _source()
    flags = [a for a in args if not a.startswith(("-DLLAMA_BUILD_", "-DGGML_RPC"))]
    subprocess.run(["cmake", "-S", source, "-B", BUILD_DIR, "-DCMAKE_BUILD_TYPE=Release",
                    "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_OPENSSL=OFF", "-DGGML_RPC=ON", "-DGGML_RPC_RDMA=OFF", *flags],
                   check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", BUILD_DIR, "--target", *TOOLS.values(), "--parallel",
                    str(os.cpu_count() or 2)], check=True, stdout=sys.stderr)
    for name, target in TOOLS.items():
        shutil.copy2(os.path.join(BUILD_DIR, "bin", target), os.path.join(out_dir, name))
    return binary


def _source() -> str:
    """llama.cpp's source tree, unpacked once from llama-cpp-python's sdist under build/."""
    unpacked = os.path.join(ROOT, "build", "peers-src")
    found = glob.glob(os.path.join(unpacked, "llama_cpp_python-*", "vendor", "llama.cpp"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(prefix="llama-sdist-") as tmp:
        with tarfile.open(_sdist(tmp)) as archive:
            archive.extractall(unpacked, filter="data")
    return glob.glob(os.path.join(unpacked, "llama_cpp_python-*", "vendor", "llama.cpp"))[0]


def llama_quantize() -> str:
    """llama.cpp's llama-quantize from the same source and CPU flags, cached in the wheelhouse
    beside the wheel (project-local, kept across clean checkouts as the wheel is: the tests
    build it, and need nothing else of llama.cpp)."""
    args = [a for a in llama_wheel.cmake_args() if not a.startswith(("-DLLAMA_BUILD_", "-DGGML_RPC"))]
    digest = os.path.basename(llama_wheel.wheel_dir(args)).removeprefix("llama-cpp-python-")
    binary = os.path.join(llama_wheel.WHEELHOUSE, "tools", f"llama-quantize-{digest}")
    if os.path.exists(binary):
        return binary
    build_dir = os.path.join(ROOT, "build", "quantize")
    subprocess.run(["cmake", "-S", _source(), "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                    "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", *args],
                   check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", build_dir, "--target", "llama-quantize", "--parallel",
                    str(os.cpu_count() or 2)], check=True, stdout=sys.stderr)
    os.makedirs(os.path.dirname(binary), exist_ok=True)
    shutil.copy2(os.path.join(build_dir, "bin", "llama-quantize"), binary + ".part")
    os.replace(binary + ".part", binary)
    return binary


AVX2_DIR = os.path.join(ROOT, "build", "peers-avx2")
AVX2_TARGETS = ["llama", "ggml", "ggml-cpu", "ggml-rpc", "llama-batched-bench", "llama-server"]


def avx2_tree() -> str:
    """The bin/ folder of llama.cpp built for an AVX2-only CPU: libllama and libggml* (the
    same source as our wheel's, so the same ABI) and llama-batched-bench and llama-server."""
    bin_dir = os.path.join(AVX2_DIR, "bin")
    if all(os.path.exists(os.path.join(bin_dir, t)) for t in ("llama-server", "llama-batched-bench", "libllama.so")):
        return bin_dir
    flags = [a for a in llama_wheel.cmake_args() if not a.startswith(("-DLLAMA_BUILD_", "-DGGML_RPC"))]
    flags = [a.split("=")[0] + "=OFF" if a.startswith(("-DGGML_AVX512", "-DGGML_AVX_VNNI", "-DGGML_AMX")) else a
             for a in flags]
    subprocess.run(["cmake", "-S", _source(), "-B", AVX2_DIR, "-DCMAKE_BUILD_TYPE=Release",
                    "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                    "-DGGML_RPC=ON", "-DGGML_RPC_RDMA=OFF", *flags], check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", AVX2_DIR, "--target", *AVX2_TARGETS, "--parallel",
                    str(os.cpu_count() or 2)], check=True, stdout=sys.stderr)
    return bin_dir


def avx2_env() -> dict:
    """The environment that runs our engine (daemon, workers, bench children) on avx2_tree()'s
    llama.cpp: our extensions find libggml through RUNPATH, which LD_LIBRARY_PATH overrides."""
    bin_dir = avx2_tree()
    return {"LD_LIBRARY_PATH": bin_dir, "LLAMA_CPP_LIB_PATH": bin_dir}


def rpc_server() -> str:
    return llama_cpp_tool("rpc-server")


def llama_cpp_python_server() -> str:
    venv = os.path.join(llama_wheel.WHEELHOUSE, "bench-venv")
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(os.path.join(venv, ".ready")):
        return python
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    wheel = subprocess.run([sys.executable, os.path.join(ROOT, "native", "llama_wheel.py")],
                           check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel,
                    *SERVER_EXTRAS], check=True, stdout=sys.stderr)
    open(os.path.join(venv, ".ready"), "w").close()
    return python


if __name__ == "__main__":
    print(llama_server())
    print(llama_batched_bench())
    print(rpc_server())
    print(llama_cpp_python_server())
