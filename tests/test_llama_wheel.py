"""native/llama_wheel.py's caches: the project's wheelhouse first, then this machine's cache of
the same key (a second checkout copies a build instead of making it again); a build fills both."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def llama_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("STACKD_WHEELHOUSE", str(tmp_path / "project"))
    monkeypatch.setenv("STACKD_WHEEL_CACHE", str(tmp_path / "machine"))
    spec = importlib.util.spec_from_file_location("llama_wheel_under_test", os.path.join(ROOT, "native", "llama_wheel.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["llama_wheel.py"])
    return module


def fake_build(args, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"), "wb") as f:
        f.write(b"built")
    with open(os.path.join(out_dir, "CMAKE_ARGS"), "w") as f:
        f.write(" ".join(args) + "\n")


def test_a_build_fills_the_machine_cache_and_a_second_checkout_copies_it(llama_wheel, monkeypatch, capsys):
    builds = []
    monkeypatch.setattr(llama_wheel, "build", lambda args, out: (builds.append(out), fake_build(args, out)))
    llama_wheel.main()
    first = capsys.readouterr().out.strip()
    assert len(builds) == 1 and open(first, "rb").read() == b"built"
    key = os.path.basename(os.path.dirname(first))
    cached = os.path.join(llama_wheel.MACHINE_CACHE, key)
    assert open(os.path.join(cached, os.path.basename(first)), "rb").read() == b"built"

    # another checkout: an empty project wheelhouse, the same machine
    other = os.path.join(os.path.dirname(llama_wheel.WHEELHOUSE), "other")
    monkeypatch.setattr(llama_wheel, "WHEELHOUSE", other)
    llama_wheel.main()
    second = capsys.readouterr().out.strip()
    assert len(builds) == 1, "copied from the machine's cache, not built again"
    assert second.startswith(other) and open(second, "rb").read() == b"built"
    assert open(os.path.join(os.path.dirname(second), "CMAKE_ARGS")).read() == open(
        os.path.join(cached, "CMAKE_ARGS")).read()


def test_other_flags_are_another_key(llama_wheel, monkeypatch):
    monkeypatch.setattr(llama_wheel, "build", fake_build)
    assert llama_wheel.wheel_dir(["-DGGML_AVX2=ON"]) != llama_wheel.wheel_dir(["-DGGML_AVX2=OFF"])


def test_an_unreadable_cache_only_means_a_build(llama_wheel, monkeypatch, capsys):
    builds = []
    monkeypatch.setattr(llama_wheel, "build", lambda args, out: (builds.append(out), fake_build(args, out)))
    monkeypatch.setattr(llama_wheel, "MACHINE_CACHE", "/proc/no-such-cache")   # cannot be written
    llama_wheel.main()
    assert len(builds) == 1 and capsys.readouterr().out.strip().endswith(".whl")
