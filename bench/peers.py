"""The peers the benchmarks compare against, built or installed once and cached.

* llama-server: llama.cpp's own server, built from the llama.cpp source inside
  llama-cpp-python's source distribution (the same version this project runs), with
  the same CPU flags as our wheel (native/llama_wheel.py), into .wheelhouse/.
* llama-batched-bench: llama.cpp's batched decode benchmark (no HTTP, no sampling), built
  the same way from the same source, beside llama-server.
* rpc-server: ggml's RPC server, for llama-server --rpc in the cluster benchmark.
* llama-cpp-python's server: the same wheel we run, plus its [server] extras, in a
  separate virtual environment (.wheelhouse/bench-venv) so they stay out of ours.

    python bench/peers.py        # builds both if needed; prints their paths
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "native"))
import llama_wheel  # noqa: E402

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
TOOLS = ("llama-server", "llama-batched-bench", "rpc-server")


def llama_cpp_tool(target: str) -> str:
    """A llama.cpp program built from the sdist's source with our wheel's CPU flags."""
    args = llama_wheel.cmake_args()
    out_dir = llama_wheel.wheel_dir(args).replace("llama-cpp-python-", "llama-server-")
    binary = os.path.join(out_dir, target)
    if os.path.exists(binary):
        return binary
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-server-") as tmp:
        with tarfile.open(_sdist(tmp)) as archive:
            archive.extractall(tmp, filter="data")
        source = glob.glob(os.path.join(tmp, "llama_cpp_python-*", "vendor", "llama.cpp"))[0]
        build = os.path.join(tmp, "build")
        flags = [a for a in args if not a.startswith(("-DLLAMA_BUILD_", "-DGGML_RPC"))]
        subprocess.run(["cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                        "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF",
                        "-DLLAMA_OPENSSL=OFF", "-DGGML_RPC=ON", "-DGGML_RPC_RDMA=OFF", *flags],
                       check=True, stdout=sys.stderr)
        subprocess.run(["cmake", "--build", build, "--target", *TOOLS, "--parallel",
                        str(os.cpu_count() or 2)], check=True, stdout=sys.stderr)
        for tool in TOOLS:
            os.replace(os.path.join(build, "bin", tool), os.path.join(out_dir, tool))
    return binary


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
