"""The K-quant kernels' activations (ggml's Q8_K: 256 values a super-block, with 16- and
32-value sums) are quantized by a SIMD path on AVX2 CPUs (kernels/src/quantize.cpp), held to the
scalar mirror of ggml's quantize_row_q8_K_ref byte for byte: the scale, every value and every
sum, on ordinary rows and on the ones that decide a tie or meet a NaN or an infinity."""
import math

import numpy as np
import pytest

from testing import kernels_check

pytestmark = pytest.mark.slow

BLOCK = 256


def rows():
    rng = np.random.default_rng(11)
    yield "normal", rng.normal(size=4 * BLOCK)
    yield "wide range", rng.normal(size=2 * BLOCK) * np.logspace(-20, 20, 2 * BLOCK)
    halves = rng.normal(size=BLOCK)
    halves[[10, 200]] = 7.0, -7.0                 # the first largest magnitude sets the sign
    yield "a tie of magnitudes, positive first", halves
    flipped = halves.copy()
    flipped[[10, 200]] = -7.0, 7.0
    yield "a tie of magnitudes, negative first", flipped
    yield "zeros", np.zeros(BLOCK)
    zero_block = rng.normal(size=2 * BLOCK)
    zero_block[:BLOCK] = 0.0
    yield "a zero block before a live one", zero_block
    yield "one value", np.eye(1, BLOCK, 77).ravel() * -3.5
    yield "a ramp", (np.arange(BLOCK) - 128) / 254.0
    with_nan = rng.normal(size=BLOCK)
    with_nan[[3, 100]] = math.nan
    yield "NaN", with_nan
    only_nan = np.full(BLOCK, math.nan)
    yield "only NaN", only_nan
    with_inf = rng.normal(size=BLOCK)
    with_inf[50] = -math.inf
    yield "an infinity", with_inf
    yield "-0", np.full(BLOCK, -0.0)


@pytest.mark.parametrize("name, row", list(rows()), ids=[name for name, _ in rows()])
def test_the_simd_quantizer_gives_the_references_bytes(name, row):
    assert kernels_check.quantize_k_matches_reference(np.ascontiguousarray(row, dtype=np.float32)), name


def test_random_rows_at_many_scales():
    rng = np.random.default_rng(5)
    for scale in (1e-30, 1e-3, 1.0, 1e3, 1e30):
        row = (rng.standard_normal(8 * BLOCK) * scale).astype(np.float32)
        assert kernels_check.quantize_k_matches_reference(row), scale
