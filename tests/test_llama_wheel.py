"""native/llama_wheel.py's caches: the project's wheelhouse first, then this machine's cache of
the same key (a second checkout copies a build instead of making it again); a build fills both.
And the aarch64 cross build's key and tag (`make wheels ARCH=aarch64`)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

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


def fake_build(args, out_dir, arch="native"):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"), "wb") as f:
        f.write(b"built")
    with open(os.path.join(out_dir, "CMAKE_ARGS"), "w") as f:
        f.write(" ".join(args) + "\n")


def test_a_build_fills_the_machine_cache_and_a_second_checkout_copies_it(llama_wheel, monkeypatch, capsys):
    builds = []
    monkeypatch.setattr(llama_wheel, "build", lambda args, out, *arch: (builds.append(out), fake_build(args, out)))
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
    monkeypatch.setattr(llama_wheel, "build", lambda args, out, *arch: (builds.append(out), fake_build(args, out)))
    monkeypatch.setattr(llama_wheel, "MACHINE_CACHE", "/proc/no-such-cache")   # cannot be written
    llama_wheel.main()
    assert len(builds) == 1 and capsys.readouterr().out.strip().endswith(".whl")


def test_the_cross_build_is_its_own_key_the_same_from_any_checkout(llama_wheel, monkeypatch, tmp_path):
    cross = llama_wheel.cmake_args(portable=True, arch="aarch64")
    assert llama_wheel.wheel_dir(cross) != llama_wheel.wheel_dir(llama_wheel.cmake_args(portable=True))
    assert f"-DCMAKE_TOOLCHAIN_FILE={llama_wheel.ROOT_MARK}/packaging/cross/aarch64-linux-gnu.cmake" in cross
    assert not any(ROOT in arg for arg in cross), "the key names no checkout's path"
    # another toolchain file is another build
    other = tmp_path / "checkout"
    shutil.copytree(os.path.join(ROOT, "packaging", "cross"), other / "packaging" / "cross")
    before = llama_wheel.wheel_dir(cross)
    monkeypatch.setattr(llama_wheel, "ROOT", str(other))
    assert llama_wheel.wheel_dir(cross) == before
    with open(other / "packaging" / "cross" / "aarch64-linux-gnu.cmake", "a") as f:
        f.write("set(CMAKE_C_FLAGS -O1)\n")
    assert llama_wheel.wheel_dir(cross) != before


def test_a_cross_build_is_portable_only(llama_wheel):
    with pytest.raises(SystemExit, match="--portable"):
        llama_wheel.cmake_args(portable=False, arch="aarch64")


def test_an_unknown_arch_is_refused(llama_wheel, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["llama_wheel.py", "--portable", "--arch", "riscv64"])
    with pytest.raises(SystemExit, match="riscv64: one of native, aarch64"):
        llama_wheel.main()


def elf(machine: int, *versions: str) -> bytes:
    """An ELF header's first 20 bytes with `machine`, then version names as .dynstr holds them."""
    return (b"\x7fELF\x02\x01\x01" + bytes(11) + machine.to_bytes(2, "little")
            + b"".join(v.encode() + b"\x00" for v in versions))


def test_glibc_needed_is_the_newest_version_named(llama_wheel):
    assert llama_wheel.glibc_needed(elf(183, "GLIBC_2.17", "GLIBC_2.34", "GLIBC_2.4", "GLIBCXX_3.4.30")) == (2, 34)
    assert llama_wheel.glibc_needed(elf(183, "GLIBC_2.3")) == (2, 17)     # manylinux2014's floor


def make_wheel(out, libraries: dict[str, bytes]) -> str:
    """A wheel as pip makes it on this machine (wheel pack writes its RECORD), holding `libraries`."""
    tree = out / "llama_cpp_python-0.3.36"
    for name, data in libraries.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    info = tree / "llama_cpp_python-0.3.36.dist-info"
    info.mkdir()
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                                "Tag: py3-none-linux_x86_64\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.36\n")
    subprocess.run([sys.executable, "-m", "wheel", "pack", "-d", str(out), str(tree)], check=True,
                   capture_output=True)
    shutil.rmtree(tree)
    return str(out / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl")


def test_a_cross_built_wheel_is_retagged_for_what_its_libraries_need(llama_wheel, tmp_path):
    wheel = make_wheel(tmp_path,
                       {"llama_cpp/lib/libllama.so": elf(183, "GLIBC_2.17", "GLIBC_2.33"),
                        "llama_cpp/lib/libggml-base.so.0": elf(183, "GLIBC_2.34")})
    retagged = llama_wheel.retag(wheel, "aarch64")
    assert os.path.basename(retagged) == "llama_cpp_python-0.3.36-py3-none-manylinux_2_34_aarch64.whl"
    assert not os.path.exists(wheel)
    with zipfile.ZipFile(retagged) as z:
        assert "Tag: py3-none-manylinux_2_34_aarch64" in z.read("llama_cpp_python-0.3.36.dist-info/WHEEL").decode()


def test_a_wheel_with_another_architecture_s_library_is_refused(llama_wheel, tmp_path):
    wheel = make_wheel(tmp_path,
                       {"llama_cpp/lib/libllama.so": elf(183), "llama_cpp/lib/libggml.so": elf(62)})
    with pytest.raises(SystemExit, match="libggml.so is not an aarch64 ELF file .e_machine 62"):
        llama_wheel.retag(wheel, "aarch64")
