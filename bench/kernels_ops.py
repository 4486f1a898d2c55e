"""Op level: one MUL_MAT, our kernels (kernels/) against ggml's CPU backend.

The weight shapes of SmolLM2-135M Q4_1 (the default chat model): its Q4_1 projections and its
tied Q8_0 vocabulary projection, batch 1/4/16/32 tokens,
the same random weights and activations on both sides, best of --repeat runs each, timed in
C around ggml_backend_graph_compute (stackd_kernels_time, in the kernels' test-only library:
stackd.testing.kernels_check).

    .venv/bin/python bench/kernels_ops.py [--threads 2] [--repeat 50] [--path avx512-vnni]
"""
from __future__ import annotations

import argparse
import os
import sys

from stackd.testing import kernels_check as check_lib

SHAPES = [("attn q / o", "q4_1", 576, 576), ("attn k / v", "q4_1", 576, 192),
          ("ffn gate / up", "q4_1", 576, 1536), ("ffn down", "q4_1", 1536, 576),
          ("vocabulary (tied)", "q8_0", 576, 49152)]
BATCHES = [1, 4, 16, 32]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--path", default=None, help="scalar, avx2 or avx512-vnni (default: best)")
    args = parser.parse_args()
    path = args.path or check_lib.best_path()
    print(f"path {path}, {args.threads} threads, best of {args.repeat}")
    print(f"| weight (type, K x rows) | batch | ggml us | ours us | speed-up |\n|---|---|---|---|---|")
    for name, type_name, k, rows in SHAPES:
        for batch in BATCHES:
            times = check_lib.time_mul_mat(type_name, k, rows, batch, path, args.threads, args.repeat)
            if times is None:
                sys.exit(f"this CPU cannot run the {path} path")
            ggml, ours = times
            print(f"| {name} ({type_name}, {k} x {rows}) | {batch} | {ggml * 1e6:.1f} | {ours * 1e6:.1f} "
                  f"| {ggml / ours:.2f}x |")


if __name__ == "__main__":
    main()
