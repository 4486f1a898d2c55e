"""Our MUL_MAT (kernels/) against ggml's CPU backend, per code path, on random Q4_1 and Q8_0
weights.

Activations are quantized exactly as ggml does (Q8_1 for Q4_1 weights, Q8_0 for Q8_0 ones),
and each block's integer dot product is exact on both sides, so the two differ only in the
order their floats are summed (kernels/src/kernels.h): we add one term per block to one
accumulator per row, ggml adds eight partial sums per row. Summing n terms in any order errs by
at most (n - 1) u times the sum of their magnitudes (u = 2^-24), so with nb blocks:
    |ours - ggml| <= (3 nb + 6) u * sum over blocks of |d_w d_a| sum|q_w q_a| (+ |m_w s_a|)
ours: 2 nb multiply-adds and a rounded scale per block; ggml: nb per partial sum, a rounded
scale, its three-level reduction and the minimum term's sum. A wrong integer or a lost block
is off by a whole term, about 1 / nb of that magnitude: over 10^3 times the bound.

Every SIMD path must also equal the scalar reference path bit for bit, and a token computed
alone must equal the same token in a batch (batch invariance). The check runs in C
(stackd_kernels_check, in the test-only library: testing.kernels_check) through ggml's public graph API.
"""
from __future__ import annotations

import pytest

from stackd.engine import accel

from testing import kernels_check as check_lib

pytestmark = pytest.mark.slow

PATHS = ["scalar", "avx2", "avx512-vnni"]

# (K, rows): SmolLM2-135M's Q4_1 matmuls (q/o, k/v, gate/up, down), then awkward ones: rows
# not a multiple of the 8-row group or of the 16 rows an AVX-512 pair covers, K not a multiple
# of 256, a single row, a single block.
MODEL_SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576)]
AWKWARD_SHAPES = [(96, 13), (320, 100), (576, 200), (32, 1), (1056, 24)]
BATCHES = [1, 3, 4, 5, 7, 13, 16, 17, 64]  # every tile and remainder: 8, 4, 2, 1 tokens


def check(k: int, rows: int, tokens: int, path: str, seed: int = 1, type_name: str = "q4_1") -> list[float]:
    result = check_lib.check_mul_mat(type_name, k, rows, tokens, path, seed, n_threads=2)
    assert result is not None
    return result


def require(path: str) -> None:
    if not accel.cpu_supports(path):
        pytest.skip(f"this CPU cannot run the {path} path: skipped, not tested")


def summation_bound(k: int) -> float:
    """The rounding bound above, relative to the terms' magnitude."""
    return (3 * (k // 32) + 6) * 2.0 ** -24


def assert_within_rounding(k, rows, tokens, path, type_name="q4_1"):
    rel_magnitude, _, batch_invariant, round_trip, same_as_scalar = check(k, rows, tokens, path,
                                                                          type_name=type_name)
    assert rel_magnitude <= summation_bound(k), (type_name, k, rows, tokens, path, rel_magnitude)
    assert batch_invariant == 1.0, "a token alone differs from the same token in the batch"
    assert round_trip == 1.0, f"reading the repacked weight back does not give the {type_name} bytes"
    assert same_as_scalar == 1.0, f"the {path} path differs from the scalar reference"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k,rows", MODEL_SHAPES + AWKWARD_SHAPES)
@pytest.mark.parametrize("tokens", BATCHES)
def test_matmul_within_rounding_of_ggml(path, k, rows, tokens):
    require(path)
    if path == "scalar" and rows * tokens > 576 * 16:
        tokens = 3  # the reference path is slow; the wide batches run on the SIMD paths
    assert_within_rounding(k, rows, tokens, path)


# The chunked form (kernels.h, GemmOut): a layer's ffn_down and attn_output add their K-blocks
# in float runs of 256 and 64 weights, the runs in double, so that a tensor split's nodes add
# what one node adds (docs/cluster.md, "Answers"). Same checks as the plain form; a K of one run
# gives the plain form's bits (one run is the plain chain, widened and rounded back), a longer K
# other bits (the name took effect).
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", ["q4_1", "q4_0", "q8_0", "q5_1", "q4_K", "q6_K"])
@pytest.mark.parametrize("k,tokens", [(1536, 1), (1536, 13), (256, 5), (8192, 3)])
def test_chunked_form_within_rounding_batch_invariant_and_the_same_on_every_path(path, type_name, k, tokens):
    require(path)
    rows = 64 if path == "scalar" else 576
    result = check_lib.check_chunked(type_name, k, rows, tokens, path)
    assert result is not None
    rel_magnitude, _, batch_invariant, round_trip, same_as_scalar, differs, same_as_plain = result
    assert rel_magnitude <= summation_bound(k), (type_name, k, tokens, path, rel_magnitude)
    assert batch_invariant == 1.0 and round_trip == 1.0
    assert same_as_scalar == 1.0, f"the {path} path's chunked form differs from the scalar reference's"
    if k <= 256:
        assert same_as_plain == 1.0, "one run must be the plain chain"
    else:
        assert differs == 1.0, "a weight named ffn_down did not take the chunked form"


def test_the_shard_planner_s_runs_are_the_kernels_own():
    """accel.py repeats backend.cpp's rule for the runs (the daemon plans shards without loading
    the kernels): a disagreement would cut a tensor split off the runs one node adds in."""
    for k in list(range(32, 20000, 32)) + [14336, 28672, 65536]:
        assert check_lib.run_for(True, k) == accel.attn_chunk_columns(k), k
        assert check_lib.run_for(False, k) == accel.ffn_chunk_columns(k), k


@pytest.mark.parametrize("path", ["avx2", "avx512-vnni"])
def test_output_projection_shape(path):
    """The widest matmul a Q4_1 model of this family has: the vocabulary projection."""
    require(path)
    assert_within_rounding(576, 49152, 16, path)


# Q8_0: SmolLM2-135M's tied vocabulary projection (576 x 49152), then awkward shapes. The
# vocabulary shape runs at the batches a decode step gives it (up to 17 here) on the SIMD
# paths, at 1 and 3 on the slow reference path.
VOCABULARY = (576, 49152)
Q8_0_CASES = (
    [(path, k, rows, tokens) for path in PATHS for (k, rows) in
     [(96, 13), (320, 100), (32, 1), (1056, 24), (576, 200)] for tokens in BATCHES] +
    [(path, *VOCABULARY, tokens) for path in PATHS
     for tokens in ([1, 3] if path == "scalar" else [1, 3, 5, 13, 16, 17])])


@pytest.mark.parametrize("path,k,rows,tokens", Q8_0_CASES)
def test_q8_0_matmul_within_rounding_of_ggml(path, k, rows, tokens):
    require(path)
    assert_within_rounding(k, rows, tokens, path, "q8_0")


@pytest.mark.parametrize("k,rows,n_ids", [(576, 49152, 1), (576, 49152, 17), (96, 13, 40), (32, 1, 3)])
def test_q8_0_get_rows_equals_ggml_bit_for_bit(k, rows, n_ids):
    """A tied embedding table lives in our buffer (kernels/src/get_rows.h): the input rows it
    gives are ggml's dequantized rows, float for float."""
    assert check_lib.get_rows_equals_ggml(k, rows, n_ids, seed=7, n_threads=2)


# Q4_0 and Q5_0 (kernels/src/layout.h): Q4_1's nibbles without the minimum, Q5_0 with a fifth
# bit each; activations as Q8_0's; each block's integer offset by -8 or -16 x the activation
# sum, exact. Q5_1: Q4_1's arithmetic with Q5_0's fifth bits. SmolLM2's shapes (a Q4_K_M file
# of it keeps most projections in Q5_0, a Q5_K_M file in Q5_1) and the awkward ones, every tile
# remainder on the SIMD paths.
OFFSET_CASES = [(type_name, path, k, rows, tokens) for type_name in ("q4_0", "q5_0", "q5_1") for path in PATHS
                for (k, rows) in MODEL_SHAPES + AWKWARD_SHAPES
                for tokens in (BATCHES if path != "scalar" or rows * k <= 576 * 200 else [1, 3])]


@pytest.mark.parametrize("type_name,path,k,rows,tokens", OFFSET_CASES)
def test_q4_0_and_q5_0_matmul_within_rounding_of_ggml(type_name, path, k, rows, tokens):
    require(path)
    assert_within_rounding(k, rows, tokens, path, type_name)


@pytest.mark.parametrize("type_name", ["q4_0", "q4_1", "q5_0", "q5_1"])
@pytest.mark.parametrize("k,rows,n_ids", [(576, 49152, 17), (96, 13, 40), (32, 1, 3)])
def test_q4_and_q5_0_get_rows_equals_ggml_bit_for_bit(type_name, k, rows, n_ids):
    """Their tables too (get_rows.h): ggml's own dequantization of ggml's blocks."""
    assert check_lib.get_rows_equals_ggml(k, rows, n_ids, seed=7, n_threads=2, type_name=type_name)


# K-quants (kernels/src/kernels_qk.h): K a multiple of the 256-weight super-block. SmolLM2's
# ffn_down (1536 -> 576), the only projection of its Q4_K_M file wide enough for a K-quant,
# then awkward shapes (rows not a multiple of 8 or 16, one super-block, one row).
K_QUANT_SHAPES = [(1536, 576), (256, 13), (512, 100), (256, 1), (768, 24)]
K_QUANT_CASES = [(type_name, path, k, rows, tokens) for type_name in ("q4_K", "q5_K", "q6_K") for path in PATHS
                 for (k, rows) in K_QUANT_SHAPES
                 for tokens in (BATCHES if path != "scalar" or rows * k <= 512 * 100 else [1, 3])]


def k_quant_bound(k: int) -> float:
    """kernels/README.md: (3 nb + 6) u of the terms' magnitude, nb super-blocks of 256."""
    return (3 * (k // 256) + 6) * 2.0 ** -24


@pytest.mark.parametrize("type_name,path,k,rows,tokens", K_QUANT_CASES)
def test_k_quant_matmul_within_rounding_of_ggml(type_name, path, k, rows, tokens):
    require(path)
    rel_magnitude, _, batch_invariant, round_trip, same_as_scalar = check(k, rows, tokens, path,
                                                                          type_name=type_name)
    assert rel_magnitude <= k_quant_bound(k), (type_name, k, rows, tokens, path, rel_magnitude)
    assert batch_invariant == 1.0, "a token alone differs from the same token in the batch"
    assert round_trip == 1.0, f"reading the repacked weight back does not give the {type_name} bytes"
    assert same_as_scalar == 1.0, f"the {path} path differs from the scalar reference"


@pytest.mark.parametrize("type_name", ["q4_K", "q5_K", "q6_K"])
@pytest.mark.parametrize("k,rows,n_ids", [(576 * 4, 49152, 17), (256, 13, 40), (512, 1, 3)])
def test_k_quant_get_rows_equals_ggml_bit_for_bit(type_name, k, rows, n_ids):
    """A Q4_K_M file's token embeddings are often Q4_K or Q6_K (get_rows.h): ggml's rows."""
    assert check_lib.get_rows_equals_ggml(k, rows, n_ids, seed=7, n_threads=2, type_name=type_name)


@pytest.mark.parametrize("type_name,shape,op,accepted", [
    ("q4_K", (1536, 576, 1), "mul_mat", True),
    ("q6_K", (1536, 576, 1), "mul_mat", True),
    ("q6_K", (2048, 13, 1), "mul_mat", True),
    ("q4_K", (2048, 49152, 1), "get_rows", True),
    ("q6_K", (2048, 49152, 1), "get_rows", True),
    ("q4_K", (1536, 576, 4), "mul_mat", False),
    ("q5_K", (1536, 576, 1), "mul_mat", True),
    ("q5_K", (2048, 49152, 1), "get_rows", True),

    ("q4_1", (576, 576, 1), "mul_mat", True),
    ("q4_1", (576, 13, 1), "mul_mat", True),
    ("q4_0", (576, 576, 1), "mul_mat", True),
    ("q5_0", (576, 1536, 1), "mul_mat", True),
    ("q5_0", (576, 576, 4), "mul_mat", False),     # a stack of matrices
    ("q5_1", (576, 576, 1), "mul_mat", True),      # a Q5_K_M file's fallback
    ("q5_1", (576, 576, 4), "mul_mat", False),     # a stack of matrices
    ("bf16", (576, 576, 1), "mul_mat", False),     # not ours: ggml computes it
    ("q8_0", (576, 49152, 1), "mul_mat", True),    # a vocabulary projection
    ("q8_0", (576, 49152, 1), "get_rows", True),   # its tied embedding table: one copy
    ("q8_0", (576, 576, 4), "mul_mat", False),
    ("f16", (576, 576, 1), "mul_mat", False),
    ("q4_1", (576, 576, 4), "mul_mat", False),     # a stack of matrices
    ("q4_1", (576, 576, 4), "mul_mat_id", False),  # MoE experts
    ("q4_1", (576, 49152, 1), "get_rows", True),   # embedding tables of the 32-weight types
    ("q5_0", (576, 49152, 1), "get_rows", True),
    ("q5_1", (576, 49152, 1), "get_rows", True),
])
def test_buffer_type_takes_only_weights_it_serves(type_name, shape, op, accepted):
    assert check_lib.accepts(type_name, shape, op) is accepted


def test_the_peer_timer_runs_ggml_s_repacked_path_where_ggml_has_one():
    """bench/kernels_ops.py's peer column: ggml's own repacked buffer (CPU_REPACK) takes Q4_K
    and Q4_0 on an AVX2 CPU, and no Q5_0 (which ggml does not repack)."""
    require("avx2")
    assert check_lib.time_ggml_repacked("q4_K", 256, 16, 1, 1, 1) > 0
    assert check_lib.time_ggml_repacked("q4_0", 64, 16, 1, 1, 1) > 0
    assert check_lib.time_ggml_repacked("q5_0", 64, 16, 1, 1, 1) is None
