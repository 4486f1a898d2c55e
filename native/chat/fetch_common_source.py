"""Fetch llama.cpp's `common/` chat library source, once, into build/ (beside ggml's headers).

The llama-cpp-python wheel ships libllama but not llama.cpp's `common` library, where the chat
formats live: template capability detection, the PEG parsers of each model family's tool-call
and reasoning syntax, and the grammars with their trigger words. The native module
`stackd._chat` compiles those files from the same llama-cpp-python release's source
distribution (the one kernels/fetch_ggml_source.py fetches: the archive is shared), never a
copy of them, never patched.

    python native/chat/fetch_common_source.py DEST_DIR   # prints DEST_DIR/.../vendor/llama.cpp
"""
from __future__ import annotations

import os
import runpy
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the kernels' fetcher downloads the sdist (and extracts ggml/): its archive is ours too
GGML = runpy.run_path(os.path.join(ROOT, "kernels", "fetch_ggml_source.py"))
VERSION = GGML["VERSION"]
NEEDED = ("common/chat.cpp", "common/peg-parser.cpp", "common/jinja/runtime.cpp",
          "vendor/nlohmann/json.hpp")
PREFIXES = ("common/", "vendor/nlohmann/")


def llama_dir(dest: str) -> str:
    return os.path.join(dest, f"llama_cpp_python-{VERSION}", "vendor", "llama.cpp")


def fetch(dest: str) -> str:
    target = llama_dir(dest)
    if all(os.path.exists(os.path.join(target, name)) for name in NEEDED):
        return target
    GGML["fetch"](dest)
    archive = os.path.join(dest, f"llama_cpp_python-{VERSION}.tar.gz")
    with tarfile.open(archive) as tar:
        head = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(head)
                   and m.name[len(head):].startswith(PREFIXES)]
        tar.extractall(dest, members=members, filter="data")
    missing = [name for name in NEEDED if not os.path.exists(os.path.join(target, name))]
    if missing:
        raise SystemExit(f"llama-cpp-python {VERSION} source lacks {missing}")
    return target


if __name__ == "__main__":
    print(fetch(os.path.abspath(sys.argv[1])))
