"""Op level: one MUL_MAT, our kernels (kernels/) against ggml's CPU backend.

The weight shapes of SmolLM2-135M Q4_1 (the default chat model): its Q4_1 projections and its
tied Q8_0 vocabulary projection; with --quants, those of its Q4_K_M file (Q5_0 projections,
K-quant ffn_down), a Q4_0 one and the Q5_K_M file's Q5_1; batch 1/4/16/32 tokens, the same random weights and
activations on every side, best of --repeat runs each, timed in C around
ggml_backend_graph_compute (testing.kernels_check). ggml runs twice where it repacks
the type itself: on plain buffers (its vec_dot) and on its own repacked buffer (CPU_REPACK:
q4_0_8x8, q4_K_8x8, what llama.cpp's loader uses, so the peer that counts).

    .venv/bin/python bench/kernels_ops.py [--threads 2] [--repeat 50] [--path avx512-vnni] [--quants]
    .venv/bin/python bench/kernels_ops.py --attention [--path avx2]

--attention times one FLASH_ATTN_EXT of a decode step instead (SmolLM2's heads: 64 wide, 9
query heads on 3 K/V heads; each stream's own KV view, its sequence a random length up to the
view, as the engine's per-slot streams are), our decode attention against ggml's per-row path,
on f16 and q8_0 caches.
"""
from __future__ import annotations

import argparse
import os
import sys

from kernels_engine import cpu_name
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing import kernels_check as check_lib  # noqa: E402

SHAPES = [("attn q / o", "q4_1", 576, 576), ("attn k / v", "q4_1", 576, 192),
          ("ffn gate / up", "q4_1", 576, 1536), ("ffn down", "q4_1", 1536, 576),
          ("vocabulary (tied)", "q8_0", 576, 49152)]
QUANT_SHAPES = [("attn q / o (Q4_K_M file)", "q5_0", 576, 576), ("ffn gate / up (Q4_K_M file)", "q5_0", 576, 1536),
                ("ffn down (Q4_K_M file)", "q4_K", 1536, 576), ("ffn down (Q4_K_M file)", "q6_K", 1536, 576),
                ("ffn down (Q5_K_M file)", "q5_K", 1536, 576), ("ffn gate / up", "q4_0", 576, 1536),
                ("ffn gate / up (Q5_K_M file)", "q5_1", 576, 1536)]
BATCHES = [1, 4, 16, 32]
ATTENTION = [(1, 256), (1, 4096), (16, 256), (16, 1024)]   # (streams, cells in each stream's view)


def attention(path: str, threads: int, repeat: int) -> None:
    print("| KV cache | streams | view (cells) | ggml us | ours us | speed-up |\n|---|---|---|---|---|---|")
    for kv_type in ("f16", "q8_0"):
        for streams, n_kv in ATTENTION:
            times = check_lib.time_attention(64, n_kv, 1, 9, 3, streams, path, threads, repeat, kv_type)
            if times is None:
                sys.exit(f"this CPU cannot run the {path} path")
            ggml, ours = times
            print(f"| {kv_type} | {streams} | {n_kv} | {ggml * 1e6:.1f} | {ours * 1e6:.1f} | {ggml / ours:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--path", default=None, help="scalar, avx2 or avx512-vnni (default: best)")
    parser.add_argument("--quants", action="store_true", help="the Q4_K_M file's types and Q4_0 instead")
    parser.add_argument("--attention", action="store_true", help="decode attention instead of matmuls")
    args = parser.parse_args()
    path = args.path or check_lib.best_path()
    print(f"{cpu_name()}; path {path}, {args.threads} threads, best of {args.repeat}")
    if args.attention:
        return attention(path, args.threads, args.repeat)
    print("| weight (type, K x rows) | batch | ggml us | ggml repacked us | ours us | speed-up (against the faster) |\n"
          "|---|---|---|---|---|---|")
    for name, type_name, k, rows in QUANT_SHAPES if args.quants else SHAPES:
        for batch in BATCHES:
            times = check_lib.time_mul_mat(type_name, k, rows, batch, path, args.threads, args.repeat)
            if times is None:
                sys.exit(f"this CPU cannot run the {path} path")
            ggml, ours = times
            repacked = check_lib.time_ggml_repacked(type_name, k, rows, batch, args.threads, args.repeat)
            best = min(ggml, repacked or ggml)
            print(f"| {name} ({type_name}, {k} x {rows}) | {batch} | {ggml * 1e6:.1f} | "
                  f"{'-' if repacked is None else f'{repacked * 1e6:.1f}'} | {ours * 1e6:.1f} | {best / ours:.2f}x |")


if __name__ == "__main__":
    main()
