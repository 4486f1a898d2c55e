"""Build (once) and locate the llama-cpp-python wheel this project runs on.

llama-cpp-python is built from source with ggml's RPC backend on. pip's own cache
ignores CMAKE_ARGS, so the wheel is kept in a project-local wheelhouse keyed by the
version and the exact flags: `.wheelhouse/<version>-<flags digest>/`. A second setup
finds it there and builds nothing.

CPU features are read from /proc/cpuinfo and passed explicitly instead of
-march=native, because -march=native also compiles ggml's AMX kernels, and those
crash (SIGSEGV in ggml_backend_amx_mul_mat) on virtual machines that report AMX.
AMX is therefore never enabled; AVX2/AVX-512 and their extensions are, where present.

    python native/llama_wheel.py            # prints the wheel's path, building it if needed
"""
from __future__ import annotations

import glob
import hashlib
import os
import platform
import subprocess
import sys
import tempfile

VERSION = "0.3.36"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELHOUSE = os.environ.get("STACKD_WHEELHOUSE", os.path.join(ROOT, ".wheelhouse"))

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


def cmake_args() -> list[str]:
    args = ["-DGGML_RPC=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
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
    digest = hashlib.sha256(" ".join(args).encode()).hexdigest()[:12]
    return os.path.join(WHEELHOUSE, f"llama-cpp-python-{VERSION}-{digest}")


def build(args: list[str], out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    env = {**os.environ, "CMAKE_ARGS": " ".join(args),
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    with tempfile.TemporaryDirectory(prefix="llama-wheel-") as tmp:
        # --no-cache-dir: pip's wheel cache is keyed by the sdist alone, not CMAKE_ARGS, and
        # would hand back a wheel built with other flags.
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-binary",
                        "llama-cpp-python", "--no-cache-dir", "--disable-pip-version-check", "-w", tmp,
                        f"llama-cpp-python=={VERSION}"], check=True, env=env,
                       stdout=sys.stderr)      # stdout carries only the wheel's path
        for path in glob.glob(os.path.join(tmp, "*.whl")):
            os.replace(path, os.path.join(out_dir, os.path.basename(path)))
    with open(os.path.join(out_dir, "CMAKE_ARGS"), "w") as f:
        f.write(" ".join(args) + "\n")


def main() -> None:
    args = cmake_args()
    out_dir = wheel_dir(args)
    wheels = glob.glob(os.path.join(out_dir, "llama_cpp_python-*.whl"))
    if not wheels:
        print(f"building llama-cpp-python {VERSION} with {' '.join(args)} (a few minutes, once)",
              file=sys.stderr, flush=True)
        build(args, out_dir)
        wheels = glob.glob(os.path.join(out_dir, "llama_cpp_python-*.whl"))
    print(wheels[0])


if __name__ == "__main__":
    main()
