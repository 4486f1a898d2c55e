"""packaging/wheels.py: the stackd wheel ships the native modules `make setup` built, byte for byte,
when they are there and current; otherwise it says why and compiles from nothing."""
import glob
import os
import runpy
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WHEELS = runpy.run_path(os.path.join(ROOT, "packaging", "wheels.py"))
PORTABLE = "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"   # a name; only its version is read


def test_the_modules_are_every_compiled_one_of_the_package():
    modules = WHEELS["native_modules"]()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    assert {"_engine" + suffix, "_chat" + suffix, "libstackd_kernels.so",
            "http/protocol" + suffix, "observe/metrics" + suffix} <= set(modules)
    compiled = runpy.run_path(os.path.join(ROOT, "server", "compiled.py"))["COMPILED_MODULES"]
    assert len(modules) == len(compiled) + 3
    assert all(path.startswith(os.path.join(ROOT, "server") + os.sep) for path in modules.values())


def test_from_scratch_on_request(monkeypatch):
    monkeypatch.setenv("STACKD_WHEEL_FROM_SCRATCH", "1")
    assert WHEELS["reused_modules"](PORTABLE) == (None, "STACKD_WHEEL_FROM_SCRATCH=1")


def test_from_scratch_when_the_llama_release_differs(monkeypatch):
    monkeypatch.delenv("STACKD_WHEEL_FROM_SCRATCH", raising=False)
    modules, why = WHEELS["reused_modules"]("llama_cpp_python-0.0.1-py3-none-linux_x86_64.whl")
    assert modules is None
    assert why  # missing, stale or the other release: each named


@pytest.mark.image
def test_the_wheel_holds_the_modules_setup_built():
    """After `make wheels` (make test-image runs it first): the wheel's compiled files are the
    checkout's, the same bytes, when wheels.py could reuse them; the wheel is tagged as built."""
    wheels = glob.glob(os.path.join(ROOT, "dist", "stackd-*.whl"))
    if not wheels:
        pytest.skip("no dist/stackd-*.whl: make wheels builds it")
    portable = glob.glob(os.path.join(ROOT, "dist", "llama_cpp_python-*.whl"))
    modules, why = WHEELS["reused_modules"](portable[0] if portable else PORTABLE)
    if modules is None:
        pytest.skip(f"the wheel was compiled from nothing: {why}")
    (wheel,) = wheels
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name, path in modules.items():
            assert f"stackd/{name}" in names, name
            with open(path, "rb") as f:
                assert z.read(f"stackd/{name}") == f.read(), f"{name} differs from {path}: make wheels again"
        info = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        text = z.read(info).decode()
    assert "Root-Is-Purelib: false" in text
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"Tag: {python}-{python}-linux_x86_64" in text
    assert os.path.basename(wheel) == f"stackd-0.1.0-{python}-{python}-linux_x86_64.whl"
