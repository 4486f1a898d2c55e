"""Build (once) and locate the llama-cpp-python wheel this project runs on.

llama-cpp-python is built from source with ggml's RPC backend on. pip's own cache
ignores CMAKE_ARGS, so the wheel is kept in a project-local wheelhouse keyed by the
version and the exact flags: `.wheelhouse/<version>-<flags digest>/`. A second setup
finds it there and builds nothing.

CPU features are read from /proc/cpuinfo and passed explicitly instead of
-march=native, because -march=native also compiles ggml's AMX kernels, and those
crash (SIGSEGV in ggml_backend_amx_mul_mat) on virtual machines that report AMX.
AMX is therefore never enabled; AVX2/AVX-512 and their extensions are, where present.

The portable build (`--portable`, what `make wheels` ships) runs on any CPU of its
architecture: ggml's CPU backend is built once per CPU generation as llama.cpp's releases
do (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS: libggml-cpu-haswell.so, -skylakex.so, ...,
each a module that scores the CPU it runs on) and the best one is loaded at run time. The
variant with AMX (sapphirerapids) is left out of the wheel, for the reason above. It is
cached beside the native one, under its own flags digest.

    python native/llama_wheel.py            # prints the wheel's path, building it if needed
    python native/llama_wheel.py --portable # the same for the portable build
    python native/llama_wheel.py --portable --arch aarch64   # the same, cross-built for arm64

The aarch64 build (`make wheels ARCH=aarch64`) is the same portable build cross-compiled with
Debian's g++-aarch64-linux-gnu (packaging/cross/aarch64-linux-gnu.cmake): ggml's ARM CPU
variants (libggml-cpu-armv8.0_1.so, -armv8.2_1.so with the dot products, ..., -armv8.6_1.so
with i8mm, -armv9.2_*.so with SME), each scoring the CPU it runs on from getauxval(AT_HWCAP),
as llama.cpp's arm64 releases are built. pip builds it on this machine, so its wheel comes out
tagged for x86-64: it is retagged manylinux_2_N_aarch64, N the newest glibc symbol version its
libraries need (read from their ELF version references, so the tag claims no more than the
libraries do). The key holds the toolchain file's digest beside the flags.

Each build is also kept in a cache of this machine's user (`~/.cache/stackd/wheelhouse`, or
STACKD_WHEEL_CACHE), under the same key: a second checkout on the same machine (a fresh clone,
CI's) copies it from there instead of building it again, as pip's own cache serves the other
packages. The key holds the version and every flag, so a cache entry is only ever the build
these flags would make.
"""
from __future__ import annotations

import glob
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

VERSION = "0.3.36"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELHOUSE = os.environ.get("STACKD_WHEELHOUSE", os.path.join(ROOT, ".wheelhouse"))
MACHINE_CACHE = os.environ.get("STACKD_WHEEL_CACHE",
                               os.path.join(os.path.expanduser("~"), ".cache", "stackd", "wheelhouse"))

# ggml option -> the /proc/cpuinfo flags it needs
X86_FEATURES = {
    "GGML_AVX": ["avx"],
    "GGML_AVX2": ["avx2"],
    "GGML_FMA": ["fma"],
    "GGML_F16C": ["f16c"],
    "GGML_BMI2": ["bmi2"],
    "GGML_AVX_VNNI": ["avx_vnni"],
    "GGML_AVX512": ["avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"],
    "GGML_AVX512_VBMI": ["avx512_vbmi", "avx512vbmi"],
    "GGML_AVX512_VNNI": ["avx512_vnni"],
    "GGML_AVX512_BF16": ["avx512_bf16"],
}


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# The CPU variants a portable wheel leaves out: AMX (see above)
DROPPED_VARIANTS = ("libggml-cpu-sapphirerapids.so",)


# The architectures a wheel is built for: this machine's, or aarch64 cross-compiled (portable only)
ARCHES = ("native", "aarch64")
TOOLCHAINS = {"aarch64": os.path.join("packaging", "cross", "aarch64-linux-gnu.cmake")}
# Where the toolchain file's path goes in the flags: the flags are the cache's key, and the same
# build from another checkout (another path) is the same build.
ROOT_MARK = "<checkout>"


def cmake_args(portable: bool = False, arch: str = "native") -> list[str]:
    args = ["-DGGML_RPC=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
    if arch != "native":
        if not portable:
            raise SystemExit(f"llama_wheel.py: --arch {arch} builds the portable wheel only (--portable)")
        args = [f"-DCMAKE_TOOLCHAIN_FILE={ROOT_MARK}/{TOOLCHAINS[arch]}"] + args
    if portable:
        # every backend a module; the CPU one per generation; installed (ggml installs
        # modules to the bin dir) beside libllama, where the package's libraries are
        return args + ["-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON",
                       "-DCMAKE_INSTALL_BINDIR=llama_cpp/lib"]
    if platform.machine() not in ("x86_64", "AMD64"):
        return args + ["-DGGML_NATIVE=ON"]
    flags = cpu_flags()
    args += ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    for option, needs in X86_FEATURES.items():
        # the VBMI flag is spelled two ways across kernels: any one spelling will do
        have = any(n in flags for n in needs) if option == "GGML_AVX512_VBMI" else all(n in flags for n in needs)
        args.append(f"-D{option}={'ON' if have else 'OFF'}")
    return args


def wheel_dir(args: list[str]) -> str:
    key = " ".join(args)
    for arch, toolchain in TOOLCHAINS.items():   # a cross build: its toolchain file and patch too
        if f"{ROOT_MARK}/{toolchain}" in key:
            with open(os.path.join(ROOT, toolchain), "rb") as f:
                key += " toolchain:" + hashlib.sha256(f.read()).hexdigest()
            key += " without:" + ",".join(UNBUILDABLE_VARIANTS[arch])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return os.path.join(WHEELHOUSE, f"llama-cpp-python-{VERSION}-{digest}")


def drop_variants(wheel: str) -> None:
    """Rewrite `wheel` without the DROPPED_VARIANTS (and their RECORD lines)."""
    with zipfile.ZipFile(wheel) as src:
        names = [n for n in src.namelist() if os.path.basename(n) not in DROPPED_VARIANTS]
        if len(names) == len(src.namelist()):
            return
        with zipfile.ZipFile(wheel + ".tmp", "w", zipfile.ZIP_DEFLATED) as out:
            for name in names:
                data = src.read(name)
                if name.endswith(".dist-info/RECORD"):
                    data = b"".join(line for line in data.splitlines(keepends=True)
                                    if os.path.basename(line.split(b",")[0].decode()) not in DROPPED_VARIANTS)
                out.writestr(src.getinfo(name), data)
    os.replace(wheel + ".tmp", wheel)


def build(args: list[str], out_dir: str, arch: str = "native") -> None:
    os.makedirs(out_dir, exist_ok=True)
    env = {**os.environ, "CMAKE_ARGS": " ".join(args).replace(ROOT_MARK, ROOT),
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    with tempfile.TemporaryDirectory(prefix="llama-wheel-") as tmp:
        # --no-cache-dir: pip's wheel cache is keyed by the sdist alone, not CMAKE_ARGS, and
        # would hand back a wheel built with other flags.
        source = f"llama-cpp-python=={VERSION}" if arch == "native" else patched_source(tmp, arch)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-binary",
                        "llama-cpp-python", "--no-cache-dir", "--disable-pip-version-check", "-w", tmp,
                        source], check=True, env=env,
                       stdout=sys.stderr)      # stdout carries only the wheel's path
        for path in glob.glob(os.path.join(tmp, "*.whl")):
            drop_variants(path)
            if arch != "native":
                path = retag(path, arch)
            os.replace(path, os.path.join(out_dir, os.path.basename(path)))
    with open(os.path.join(out_dir, "CMAKE_ARGS"), "w") as f:
        f.write(" ".join(args) + "\n")


ELF_MACHINES = {"aarch64": 183}
# ggml's CPU variants that Debian bookworm's cross compiler cannot build: GCC 12 knows neither
# -march=armv9.2-a nor +sme (GCC 14 does). llama.cpp's arm64 releases have them; their one
# difference from armv8.6_2 is SME, which ggml's CPU backend uses only through KleidiAI (off in
# this build), so a CPU with SME loads armv8.6_2 instead and loses nothing ggml would run.
UNBUILDABLE_VARIANTS = {"aarch64": ("armv9.2_1", "armv9.2_2")}
VARIANTS_FILE = os.path.join("vendor", "llama.cpp", "ggml", "src", "CMakeLists.txt")


def patched_source(tmp: str, arch: str) -> str:
    """The release's sdist unpacked into `tmp`, with UNBUILDABLE_VARIANTS[arch] taken out of
    ggml's variant list (each line that adds one must be there: a release that changed them
    fails here, not in a compile). Returns the source folder."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "--disable-pip-version-check", "-q", "-d", tmp, f"llama-cpp-python=={VERSION}"],
                   check=True, stdout=sys.stderr)
    (sdist,) = glob.glob(os.path.join(tmp, "llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as t:
        t.extractall(tmp, filter="data")
    source = sdist[:-len(".tar.gz")]
    path = os.path.join(source, VARIANTS_FILE)
    with open(path) as f:
        lines = f.readlines()
    kept = [line for line in lines
            if not any(line.strip().startswith(f"ggml_add_cpu_backend_variant({name} ")
                       for name in UNBUILDABLE_VARIANTS[arch])]
    if len(lines) - len(kept) != len(UNBUILDABLE_VARIANTS[arch]):
        raise SystemExit(f"{path}: expected one line for each of {UNBUILDABLE_VARIANTS[arch]}")
    with open(path, "w") as f:
        f.writelines(kept)
    return source


def glibc_needed(data: bytes) -> tuple[int, int]:
    """The newest GLIBC_x.y version an ELF shared object's version references name (its
    .gnu.version_r: what the loader checks before it runs it); (2, 17) when none is newer."""
    newest = (2, 17)
    for major, minor in re.findall(rb"GLIBC_(\d+)\.(\d+)\x00", data):
        newest = max(newest, (int(major), int(minor)))
    return newest


def retag(wheel: str, arch: str) -> str:
    """A cross-built wheel (tagged by pip for this machine) retagged for `arch`: its libraries
    checked to be `arch`'s ELF files, the tag manylinux_2_N_<arch> with N what they need of
    glibc. Returns the retagged wheel's path (beside the old one, which is removed)."""
    newest = (2, 17)
    with zipfile.ZipFile(wheel) as z:
        libraries = [n for n in z.namelist() if re.search(r"\.so(\.\d+)*$", n)]
        if not libraries:
            raise SystemExit(f"{wheel}: no shared libraries in it")
        for name in libraries:
            data = z.read(name)
            machine = int.from_bytes(data[18:20], "little") if data[:4] == b"\x7fELF" else None
            if machine != ELF_MACHINES[arch]:
                raise SystemExit(f"{wheel}: {name} is not an {arch} ELF file (e_machine {machine})")
            newest = max(newest, glibc_needed(data))
    platform_tag = f"manylinux_{newest[0]}_{newest[1]}_{arch}"
    out = os.path.dirname(wheel)
    before = set(os.listdir(out))
    subprocess.run([sys.executable, "-m", "wheel", "tags", "--remove", "--platform-tag", platform_tag, wheel],
                   check=True, stdout=sys.stderr)
    (retagged,) = set(os.listdir(out)) - before
    return os.path.join(out, retagged)


def copy_build(src: str, dst: str) -> bool:
    """The wheel and its CMAKE_ARGS from one wheelhouse folder to another (the wheel last,
    through a temporary name: a folder holding a wheel holds a whole one). False when `src`
    has none, or the copy failed (the cache is a convenience: a failure only means a build)."""
    wheels = glob.glob(os.path.join(src, "llama_cpp_python-*.whl"))
    if not wheels:
        return False
    try:
        os.makedirs(dst, exist_ok=True)
        shutil.copyfile(os.path.join(src, "CMAKE_ARGS"), os.path.join(dst, "CMAKE_ARGS"))
        target = os.path.join(dst, os.path.basename(wheels[0]))
        shutil.copyfile(wheels[0], target + ".tmp")
        os.replace(target + ".tmp", target)
    except OSError:
        return False
    return True


def main() -> None:
    argv = sys.argv[1:]
    arch = argv[argv.index("--arch") + 1] if "--arch" in argv else "native"
    if arch not in ARCHES:
        raise SystemExit(f"llama_wheel.py: --arch {arch}: one of {', '.join(ARCHES)}")
    args = cmake_args(portable="--portable" in argv, arch=arch)
    out_dir = wheel_dir(args)
    cached = os.path.join(MACHINE_CACHE, os.path.basename(out_dir))
    wheels = glob.glob(os.path.join(out_dir, "llama_cpp_python-*.whl"))
    if not wheels and copy_build(cached, out_dir):
        print(f"llama-cpp-python {VERSION}: this machine's build of these flags, from {cached}",
              file=sys.stderr, flush=True)
    elif not wheels:
        print(f"building llama-cpp-python {VERSION} with {' '.join(args)} (a few minutes, once)",
              file=sys.stderr, flush=True)
        build(args, out_dir, arch)
    if not glob.glob(os.path.join(cached, "llama_cpp_python-*.whl")):
        copy_build(out_dir, cached)            # for the next checkout on this machine
    print(glob.glob(os.path.join(out_dir, "llama_cpp_python-*.whl"))[0])


if __name__ == "__main__":
    main()
