"""Fetch the llama.cpp source our kernels build against, once, into build/.

The kernels library plugs into ggml's backend interface, whose structs live in headers
that the llama-cpp-python wheel does not install (ggml-backend-impl.h, ggml-common.h).
They must match the ggml that is loaded at run time exactly, so they come from the same
llama-cpp-python release's source distribution (which vendors llama.cpp), fetched with
pip at build time. Nothing of it is committed, and nothing of it is patched.

    python kernels/fetch_ggml_source.py DEST_DIR   # prints DEST_DIR/.../vendor/llama.cpp/ggml
"""
from __future__ import annotations

import glob
import os
import runpy
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION = runpy.run_path(os.path.join(ROOT, "native", "llama_wheel.py"))["VERSION"]
NEEDED = ("src/ggml-backend-impl.h", "src/ggml-common.h", "include/ggml.h")


def llama_dir(dest: str) -> str:
    """Where the sdist's vendored llama.cpp is extracted under `dest`."""
    return os.path.join(dest, f"llama_cpp_python-{VERSION}", "vendor", "llama.cpp")


def ggml_dir(dest: str) -> str:
    return os.path.join(llama_dir(dest), "ggml")


def extract(dest: str, parts: tuple[str, ...], needed: tuple[str, ...]) -> str:
    """llama.cpp's folders `parts` (e.g. "ggml/") from the sdist, downloaded once into `dest`
    and shared by every fetcher; `needed` (paths under llama.cpp/) must then exist."""
    target = llama_dir(dest)
    if all(os.path.exists(os.path.join(target, name)) for name in needed):
        return target
    os.makedirs(dest, exist_ok=True)
    archives = glob.glob(os.path.join(dest, f"llama_cpp_python-{VERSION}.tar.gz"))
    if not archives:
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                               "-q", "--no-deps", "--no-binary", "llama-cpp-python",
                               f"llama-cpp-python=={VERSION}", "-d", dest],
                              stdout=sys.stderr)
        archives = glob.glob(os.path.join(dest, f"llama_cpp_python-{VERSION}.tar.gz"))
    with tarfile.open(archives[0]) as tar:
        head = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(head)
                   and m.name[len(head):].startswith(parts)]
        tar.extractall(dest, members=members, filter="data")
    missing = [name for name in needed if not os.path.exists(os.path.join(target, name))]
    if missing:
        raise SystemExit(f"llama-cpp-python {VERSION} source lacks {missing}")
    return target


def fetch(dest: str) -> str:
    extract(dest, ("ggml/",), tuple("ggml/" + name for name in NEEDED))
    return ggml_dir(dest)


if __name__ == "__main__":
    print(fetch(os.path.abspath(sys.argv[1])))
