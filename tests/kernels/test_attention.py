"""Our decode attention (kernels/src/attention.h) against the exact result and ggml's per-row
flash attention, per code path, on random f16 and q8_0 K/V caches shaped as llama.cpp builds
them with one KV stream per sequence (the engine's layout).

The exact result is computed in double from the cache's values and the query rounded to f16.
Our arithmetic is a fixed sequence of float operations, so its distance from the exact result
has a bound (check.cpp's exact_attention states it: the scores' rounding, each block's
rescaling, the sums). ggml's accumulates V in f16 on an f16 cache, and quantizes the query to
8 bits on a q8_0 one, so the bound against ggml adds those. A lost cell, a wrong scale or a
mask applied to the wrong row is off by about 1 / n_live of the output: hundreds of times
either bound.

Every SIMD path must also equal the scalar reference bit for bit, and a sequence computed alone
(with a longer, padded view, as when a longer sequence shares its step) must equal the same
sequence in the batch.
"""
from __future__ import annotations

import pytest

from stackd.engine import accel
from testing import kernels_check as check_lib

pytestmark = pytest.mark.slow

PATHS = ["scalar", "avx2", "avx512-vnni"]

# (dk, dv, n_kv, tokens, n_head, n_head_kv, n_streams)
SHAPES = [
    (64, 64, 256, 1, 9, 3, 16),     # SmolLM2-135M's decode step at 16 streams
    (64, 64, 160, 1, 9, 3, 1),      # one stream: a task per query row
    (128, 128, 300, 5, 8, 2, 2),    # a verification step (5 rows, causal), a view not a multiple of 16
    (64, 64, 40, 63, 4, 4, 1),      # the most rows a per-row step has (63), no grouping
    (32, 64, 17, 1, 2, 1, 3),       # the smallest q8_0 head (16 for f16 below), dk != dv, a cell past a block
    (256, 256, 15, 2, 4, 1, 2),     # the largest head size, a view shorter than one block
    (96, 96, 1, 1, 2, 2, 1),        # a single cell
]


def require(path: str) -> None:
    if not accel.cpu_supports(path):
        pytest.skip(f"this CPU cannot run the {path} path: skipped, not tested")


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_attention_within_its_bound(path, shape, kv_type):
    require(path)
    within_exact, within_ggml, batch_invariant, same_as_scalar, ran = check_lib.check_attention(
        *shape, path, kv_type=kv_type)
    assert ran == 1.0, "the node fell back to ggml"
    assert within_exact <= 1.0, (shape, path, within_exact)
    assert within_ggml <= 1.0, (shape, path, within_ggml)
    assert batch_invariant == 1.0, "a sequence alone differs from the same sequence in the batch"
    assert same_as_scalar == 1.0, f"the {path} path differs from the scalar reference"


# The other layout ggml allows (each K/V head's cells contiguous), and thread counts that deal a
# step's streams whole (attention.cpp: each thread reads its streams' rows first) or cannot.
@pytest.mark.parametrize("n_threads", [1, 2, 3, 8])
@pytest.mark.parametrize("heads_in_row", [True, False], ids=["cache-layout", "head-major"])
def test_streams_dealt_whole_or_not(heads_in_row, n_threads):
    path = check_lib.best_path()
    within_exact, within_ggml, batch_invariant, same_as_scalar, ran = check_lib.check_attention(
        64, 64, 256, 2, 9, 3, 7, path, n_threads=n_threads, heads_in_row=heads_in_row)
    assert ran == 1.0 and within_exact <= 1.0 and within_ggml <= 1.0
    assert batch_invariant == 1.0 and same_as_scalar == 1.0


# A step of one to three streams has fewer (stream, K/V head) units than the threads want: its
# rows are cut into one run a thread (attention.cpp, deal_runs), at seams that fall inside a
# unit by the thread count and the streams' lengths. A sequence alone is cut elsewhere than in
# its batch, so batch_invariant holds the grouping of rows to no bit of theirs.
@pytest.mark.parametrize("n_threads", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("shape", [(64, 64, 160, 1, 9, 3, 1), (64, 64, 256, 1, 9, 3, 2), (64, 64, 200, 1, 9, 3, 3),
                                   (128, 128, 300, 5, 8, 2, 2), (64, 64, 96, 3, 4, 1, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_rows_dealt_in_runs(shape, n_threads):
    path = check_lib.best_path()
    within_exact, within_ggml, batch_invariant, same_as_scalar, ran = check_lib.check_attention(
        *shape, path, n_threads=n_threads)
    assert ran == 1.0 and within_exact <= 1.0 and within_ggml <= 1.0
    assert batch_invariant == 1.0 and same_as_scalar == 1.0


def test_the_smallest_f16_head():
    path = check_lib.best_path()
    within_exact, within_ggml, batch_invariant, same_as_scalar, ran = check_lib.check_attention(
        16, 16, 40, 1, 2, 1, 2, path)
    assert ran == 1.0 and within_exact <= 1.0 and within_ggml <= 1.0
    assert batch_invariant == 1.0 and same_as_scalar == 1.0


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_decode_attention_on_other_draws(seed):
    path = check_lib.best_path()
    within_exact, within_ggml, batch_invariant, same_as_scalar, ran = check_lib.check_attention(
        64, 64, 200, 3, 9, 3, 4, path, seed=seed)
    assert ran == 1.0 and within_exact <= 1.0 and within_ggml <= 1.0
    assert batch_invariant == 1.0 and same_as_scalar == 1.0


# Shapes we leave to ggml: a head size not a multiple of 16, one over 256, a q8_0 row that is
# not whole blocks (ggml has none either: a q8_0 row is whole 32-value blocks).
@pytest.mark.parametrize("shape, kv_type", [((72, 72, 64, 1, 4, 2, 2), "f16"), ((512, 512, 32, 1, 2, 1, 1), "f16"),
                                            ((512, 512, 32, 1, 2, 1, 1), "q8_0")],
                         ids=["head-72", "head-512", "head-512-q8_0"])
def test_shapes_we_do_not_take_fall_back_to_ggml(shape, kv_type):
    within_exact, within_ggml, _, _, ran = check_lib.check_attention(*shape, check_lib.best_path(), kv_type=kv_type)
    assert ran == 0.0
    assert within_ggml == 0.0, "a node ggml computed must equal ggml's result"
