"""Instructions retired by one matmul, ours and ggml's, under qemu-aarch64 (kernels/README.md,
"The ARM paths": the table). Emulation is no clock: this counts work, not time.

    .venv/bin/python -m tests.kernels.aarch64_count [--cpu cortex-a76]

Debian's qemu-user-static has no TCG plugins (no libinsn.so), so the count is qemu's own log:
`-one-insn-per-tb` (7.2's `-singlestep`) makes each guest instruction a translation block,
`-d exec,nochain` logs every block executed, and `-dfilter` keeps only the op's code: ours,
every function of the kernels but the repack (the activations' quantization included); ggml's,
every function of its CPU backend (libggml-cpu.a: the graph's compute, from_float, vec_dot or
sgemm), one thread both. ggml is cross-built from the same llama.cpp source (build/aarch64-ggml,
static, -march=armv8.2-a+dotprod, no OpenMP) the first time.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading

from tests.kernels import aarch64_check as check

ROOT = check.ROOT
GGML_BUILD = os.path.join(ROOT, "build", "aarch64-ggml")
# SmolLM2's K (576) against a third of its FFN rows (1536): counts grow with rows x tokens.
SHAPES = [("q4_0", 512, 576, 1), ("q4_0", 512, 576, 4), ("q4_1", 512, 576, 1), ("q4_1", 512, 576, 4),
          ("q8_0", 512, 576, 1), ("q8_0", 512, 576, 4)]
# ggml's start-up, not its op: the fp16 tables ggml_cpu_init fills (6.2 M instructions), and the
# thread pool ggml_graph_compute_with_ctx makes and frees per call (llama.cpp keeps one).
GGML_NOT_THE_OP = ("ggml_cpu_init", "ggml_threadpool_new_impl", "ggml_threadpool_free")


def ggml_libraries() -> list[str]:
    """libggml-cpu.a and libggml-base.a for aarch64, built once from the full sdist's ggml/."""
    libs = [os.path.join(GGML_BUILD, "src", "libggml-cpu.a"), os.path.join(GGML_BUILD, "src", "libggml-base.a")]
    if all(os.path.exists(lib) for lib in libs):
        return libs
    src_root = os.path.join(ROOT, "build", "aarch64-ggml-src")
    tarball = next(os.path.join(ROOT, "build", "ggml-src", n) for n in os.listdir(os.path.join(ROOT, "build", "ggml-src"))
                   if n.endswith(".tar.gz"))
    top = os.path.basename(tarball)[:-len(".tar.gz")]
    ggml = os.path.join(src_root, top, "vendor", "llama.cpp", "ggml")
    if not os.path.isdir(ggml):
        os.makedirs(src_root, exist_ok=True)
        subprocess.run(["tar", "-xzf", tarball, "-C", src_root, f"{top}/vendor/llama.cpp/ggml"], check=True)
    open(os.path.join(ggml, "ggml.pc.in"), "a").close()   # the sdist leaves out the pkg-config template
    subprocess.run(["cmake", "-S", ggml, "-B", GGML_BUILD,
                    f"-DCMAKE_TOOLCHAIN_FILE={ROOT}/packaging/cross/aarch64-linux-gnu.cmake",
                    "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF",
                    "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod", "-DGGML_BACKEND_DL=OFF", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True)
    subprocess.run(["nice", "-n", "10", "cmake", "--build", GGML_BUILD, "--target", "ggml-cpu", "ggml-base", "-j2"],
                   check=True, capture_output=True)
    return libs


def build() -> str:
    libs = ggml_libraries()
    program = os.path.join(ROOT, "build", "aarch64-count", "ops_count")
    if os.path.exists(program) and os.environ.get("STACKD_COUNT_REBUILD") != "1":
        return program
    ggml = check.ggml_dir()
    os.makedirs(os.path.dirname(program), exist_ok=True)
    sources = [s for s in check.SOURCES if not s.endswith(("paths_check.cpp", "ggml_fp16.cpp"))]
    sources.append(os.path.join(ROOT, "kernels", "check", "ops_count.cpp"))
    include = ["-I", check.SRC, "-I", os.path.join(ggml, "include"), "-I", os.path.join(ggml, "src")]
    subprocess.run([check.CXX, *check.FLAGS, *include, "-static", "-o", program, *sources, *libs, "-lpthread", "-lm"],
                   check=True)
    return program


def ranges(program: str, who: str) -> str:
    """-dfilter's address ranges: the op's functions (see the module's docstring)."""
    if who == "ggml":
        names = set()
        listing = subprocess.run(["aarch64-linux-gnu-nm", "--defined-only", ggml_libraries()[0]],
                                 capture_output=True, text=True, check=True).stdout
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "Tt":
                names.add(parts[2])
    symbols = subprocess.run(["aarch64-linux-gnu-nm", "-S", "--defined-only", program],
                             capture_output=True, text=True, check=True).stdout
    spans = []
    for line in symbols.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[2] not in "Tt":
            continue
        address, size, name = int(parts[0], 16), int(parts[1], 16), parts[3]
        if who == "ggml":
            keep = name in names and not name.startswith(GGML_NOT_THE_OP)
        else:   # the kernels' namespace, but the repack and the check's own setup
            # (_ZZN: a lambda's body, e.g. the tile driver's per-tile-size calls, when not inlined)
            keep = name.startswith(("_ZN6stackd", "_ZZN6stackd")) and "repack" not in name and "to_lane" not in name
        if keep and size > 0:
            spans.append(f"0x{address:x}+0x{size:x}")
    return ",".join(spans)


def count(program: str, cpu: str, who: str, shape: tuple) -> int:
    """Guest instructions the op retires (a log line a one-instruction block executed)."""
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "log")
        os.mkfifo(fifo)
        result = {}

        def read():
            n = 0
            with open(fifo, "rb") as f:
                for line in f:
                    n += line.startswith(b"Trace")
            result["n"] = n

        reader = threading.Thread(target=read)
        reader.start()
        name, rows, k, tokens = shape
        subprocess.run([check.qemu(), "-L", check.SYSROOT, "-cpu", cpu, "-singlestep", "-d", "exec,nochain",
                        "-dfilter", ranges(program, who), "-D", fifo, program, who, name, str(rows), str(k), str(tokens)],
                       check=True, capture_output=True)
        reader.join()
        return result["n"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", default="cortex-a76")
    args = parser.parse_args()
    program = build()
    print(f"| type | rows x K | tokens | ours ({args.cpu}) | ggml | ggml / ours |")
    print("|---|---|---|---|---|---|")
    for shape in SHAPES:
        ours, ggml = count(program, args.cpu, "ours", shape), count(program, args.cpu, "ggml", shape)
        name, rows, k, tokens = shape
        print(f"| {name} | {rows} x {k} | {tokens} | {ours:,} | {ggml:,} | {ggml / ours:.2f}x |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
