"""Our kernels' aarch64 paths under emulation: every format and op (the Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K, Q5_K, Q6_K matmuls in both forms, decode attention on f16 and q8_0, the logits
candidates' scan), each NEON path bit for bit the scalar path, and each token alone as in a
batch (kernels/check/paths_check.cpp), under qemu-aarch64 with three CPU models:

- cortex-a76 (Raspberry Pi 5, RK3588): the dot products, no i8mm: the neon-dotprod path;
- max (everything qemu emulates: i8mm, SVE): the neon-i8mm path, and neon-dotprod checked too;
- cortex-a53 (no dot products): the scalar path, i.e. engine.kernels = auto keeps ggml's kernels.

The quick shapes run in `make test` (about a minute: the cross compile, cached in build/, and a
second or two per CPU); the full sweep (every tile size, partial groups, long K, head sizes to
256; ~1 min per CPU under TCG) is marked aarch64_full, which `make test-aarch64` runs."""
import pytest

from tests.kernels import aarch64_check

pytestmark = [pytest.mark.aarch64,
              pytest.mark.skipif(aarch64_check.missing() is not None, reason=str(aarch64_check.missing()))]


@pytest.fixture(scope="module")
def program():
    return aarch64_check.build()


def check(program: str, cpu: str, *args: str) -> str:
    done = aarch64_check.run(program, cpu, *args)
    print(f"qemu-aarch64 -cpu {cpu}:\n{done.stdout}")   # the path each CPU chose (pytest -s, or -rA)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("cpu", list(aarch64_check.CPUS))
def test_each_path_equals_scalar_under_qemu(program, cpu):
    out = check(program, cpu)
    chosen = aarch64_check.CPUS[cpu]
    assert f"cpu: best path {chosen}\n" in out
    assert ("kernels: ggml's" if chosen == "scalar" else f"kernels: ours, {chosen}") in out
    summary = out.strip().splitlines()[-1]
    assert ", differing: 0 " in summary, summary
    if cpu == "max":   # both NEON paths held to scalar
        assert "cpu: paths neon-dotprod neon-i8mm\n" in out
    checks = int(summary.split("checks: ")[1].split(",")[0])
    assert checks >= (48 if chosen == "scalar" else 200), summary   # not an empty run


@pytest.mark.aarch64_full
@pytest.mark.parametrize("cpu", ["cortex-a76", "max"])
def test_each_path_equals_scalar_under_qemu_full_sweep(program, cpu):
    out = check(program, cpu, "--full")
    assert ", differing: 0 " in out.strip().splitlines()[-1]


def test_a_wrong_result_is_seen(program, tmp_path):
    """The check can fail: a path that differs from scalar is reported (the program's own
    self-test flips a bit of one path's output first)."""
    done = aarch64_check.run(program, "cortex-a76", "--self-test")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "DIFFERS neon-dotprod vs scalar" in done.stdout
