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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the kernels' fetcher downloads the sdist once and extracts the folders each build needs
GGML = runpy.run_path(os.path.join(ROOT, "kernels", "fetch_ggml_source.py"))
NEEDED = ("common/chat.cpp", "common/peg-parser.cpp", "common/jinja/runtime.cpp",
          "vendor/nlohmann/json.hpp")
PREFIXES = ("common/", "vendor/nlohmann/")


def fetch(dest: str) -> str:
    return GGML["extract"](dest, PREFIXES, NEEDED)


if __name__ == "__main__":
    print(fetch(os.path.abspath(sys.argv[1])))
