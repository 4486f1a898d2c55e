"""A Q4_K_M (or Q5_K_M) file for the K-quant kernels' tests and benchmarks, made from the
default chat model with llama.cpp's own llama-quantize (--allow-requantize: the default is Q4_1, so the
quality of the result is not the point; the kernels on it are). llama-quantize is built from
the vendored llama.cpp source by bench/peers.py and cached in the wheelhouse (tools/); the file is
cached under build/models/.

    python -m testing.quantized_model [Q5_K_M]   # prints the file's path, making it if needed

SmolLM2-135M's rows are 576 wide, not a multiple of the 256 weights of a K-quant super-block,
so llama-quantize gives most matrices its fallbacks (Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for
Q6_K): its ffn_down (1536 wide) is the part that becomes Q4_K (Q5_K) and Q6_K.
"""
from __future__ import annotations

import os
import runpy
import subprocess
import sys

from stackd.store import defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the checkout
KINDS = ("Q4_K_M", "Q5_K_M")


def llama_quantize() -> str:
    return runpy.run_path(os.path.join(ROOT, "bench", "peers.py"))["llama_quantize"]()


def quantized(kind: str = "Q4_K_M") -> str:
    """The file's path for one of KINDS (made once)."""
    if kind not in KINDS:
        raise ValueError(f"kind: one of {KINDS}")
    path = os.path.join(ROOT, "build", "models", f"SmolLM2-135M-Instruct.{kind}.gguf")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run([llama_quantize(), "--allow-requantize", defaults.smollm2_path(), path + ".part", kind],
                   check=True, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    os.replace(path + ".part", path)
    return path


def q4_k_m() -> str:
    return quantized("Q4_K_M")


if __name__ == "__main__":
    print(quantized(*sys.argv[1:2]))
