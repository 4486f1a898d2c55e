"""The node's compute figure: a real measurement on this machine, in a child process, and what
the daemon reports and the leader accepts of it."""
from __future__ import annotations

import os

import pytest

from stackd.cluster import compute_speed
from stackd.cluster.membership import peer_node
from testing.loopback_peers import parse_test_computes, parse_test_peers


def test_the_measurement_is_a_sane_positive_figure():
    gflops = compute_speed.measure(1)
    # A decode-shaped Q4_1 matmul on one core: far above nothing, far below any CPU's peak.
    assert 0.05 < gflops < 10_000


def test_the_child_measures_the_same_way():
    assert compute_speed.measure_in_child(1) > 0.05


def test_a_failed_child_leaves_the_node_unmeasured(monkeypatch):
    monkeypatch.setattr(compute_speed, "CHILD_TIMEOUT", 0.001)     # no child answers in 1 ms
    assert compute_speed.measure_in_child(1) == 0.0


def test_a_fixed_figure_is_not_measured():
    speed = compute_speed.ComputeSpeed(1, fixed=3.5)
    speed.start()
    assert speed.value == 3.5


def test_a_peer_entry_carries_its_compute():
    entry = {"id": "f1", "role": "follower", "status": "up", "compute": 12.5}
    assert peer_node(entry).compute == 12.5
    assert peer_node({**entry, "compute": None}).compute == 0.0
    assert peer_node({"id": "f1", "role": "follower", "status": "up"}).compute == 0.0


def test_simulated_peers_take_a_compute_figure():
    assert parse_test_peers("f1=512,f2=256@2.5") == {"f1": 512, "f2": 256}
    assert parse_test_computes("f1=512,f2=256@2.5") == {"f2": 2.5}
    with pytest.raises(ValueError):
        parse_test_peers("f1=512@fast")


def test_a_portable_build_measures_with_the_best_cpu_variant(tmp_path):
    """make wheels' llama-cpp-python (ggml's CPU variants, no libggml-cpu.so): the variant that
    scores highest on this machine is the one measured with."""
    import glob
    import zipfile
    from stackd.cluster import compute_speed
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    wheels = glob.glob(os.path.join(root, "dist", "llama_cpp_python-*.whl"))
    if not wheels:
        pytest.skip("no portable wheel in dist/ (make wheels writes it; make test runs it first)")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(tmp_path, [n for n in wheel.namelist() if n.startswith("llama_cpp/lib/")])
    lib_dir = str(tmp_path / "llama_cpp" / "lib")
    chosen = compute_speed.cpu_library(lib_dir)
    assert os.path.basename(chosen).startswith("libggml-cpu-") and chosen.endswith(".so")
    assert not os.path.exists(os.path.join(lib_dir, "libggml-cpu.so"))
