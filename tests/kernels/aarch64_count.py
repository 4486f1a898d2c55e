"""Instructions retired by one matmul, ours and ggml's, under qemu-aarch64 (kernels/README.md,
"The ARM paths": the table). Emulation is no clock: this counts work, not time.

    .venv/bin/python -m tests.kernels.aarch64_count [--cpu cortex-a76]          # one matmul per format
    .venv/bin/python -m tests.kernels.aarch64_count --cpu max --tokens 4        # the i8mm path
    .venv/bin/python -m tests.kernels.aarch64_count --decode                    # a decode step's matmuls

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
# SmolLM2's K (576) against a third of its FFN rows (1536): counts grow with rows x tokens. The
# K-quants' super-blocks are 256 wide, which 576 is not: their K is the FFN's down projection's.
SHAPES = [(name, 512, k, tokens) for name, k in (("q4_0", 576), ("q4_1", 576), ("q5_0", 576), ("q8_0", 576),
                                                  ("q4_k", 1536), ("q5_k", 1536), ("q6_k", 1536))
          for tokens in (1, 4)]
# One decode step's matmuls of the default chat model (SmolLM2-135M, Q4_1, tied Q8_0 embeddings):
# each layer's projections (rows x K), 30 layers, then the vocabulary projection, counted on a
# twelfth of its 49,152 rows and times 12: both sides do the same work per row group, and one
# instruction a log line makes the whole of it ~30 M lines to read.
DECODE_LAYER = [("q4_1", 576, 576), ("q4_1", 192, 576), ("q4_1", 192, 576), ("q4_1", 576, 576),
                ("q4_1", 1536, 576), ("q4_1", 1536, 576), ("q4_1", 576, 1536)]
DECODE_LAYERS = 30
DECODE_HEAD = ("q8_0", 4096, 576)
DECODE_HEAD_TIMES = 12
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
                    "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod", "-DGGML_BACKEND_DL=OFF", "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF"],
                   check=True, capture_output=True)
    subprocess.run(["nice", "-n", "10", "cmake", "--build", GGML_BUILD, "--target", "ggml-cpu", "ggml-base", "-j2"],
                   check=True, capture_output=True)
    return libs


def build() -> str:
    libs = ggml_libraries()
    program = os.path.join(ROOT, "build", "aarch64-count", "ops_count")
    source = os.path.join(ROOT, "kernels", "check", "ops_count.cpp")
    if os.path.exists(program) and os.path.getmtime(program) > os.path.getmtime(source) \
            and os.environ.get("STACKD_COUNT_REBUILD") != "1":
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


def decode_step(program: str, cpu: str) -> None:
    """The matmuls of one decode step at one token: each distinct shape counted once, times
    how often the step runs it."""
    totals = {"ours": 0, "ggml": 0}
    print(f"| matmul | rows x K | a step | ours ({cpu}) | ggml | ggml / ours |")
    print("|---|---|---|---|---|---|")
    shapes = {}
    for shape in DECODE_LAYER:
        shapes[shape] = shapes.get(shape, 0) + DECODE_LAYERS
    shapes[DECODE_HEAD] = DECODE_HEAD_TIMES
    for (name, rows, k), times in shapes.items():
        ours, ggml = (count(program, cpu, who, (name, rows, k, 1)) for who in ("ours", "ggml"))
        totals["ours"] += ours * times
        totals["ggml"] += ggml * times
        print(f"| {name} | {rows} x {k} | {times}x | {ours:,} | {ggml:,} | {ggml / ours:.2f}x |", flush=True)
    print(f"| a decode step's matmuls | | | {totals['ours']:,} | {totals['ggml']:,} | "
          f"{totals['ggml'] / totals['ours']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", default="cortex-a76")
    parser.add_argument("--tokens", type=int, default=None, help="only the shapes of this many tokens")
    parser.add_argument("--decode", action="store_true", help="a decode step's matmuls instead")
    args = parser.parse_args()
    program = build()
    if args.decode:
        decode_step(program, args.cpu)
        return
    print(f"| type | rows x K | tokens | ours ({args.cpu}) | ggml | ggml / ours |")
    print("|---|---|---|---|---|---|")
    for shape in SHAPES:
        if args.tokens is not None and shape[3] != args.tokens:
            continue
        ours, ggml = count(program, args.cpu, "ours", shape), count(program, args.cpu, "ggml", shape)
        name, rows, k, tokens = shape
        print(f"| {name} | {rows} x {k} | {tokens} | {ours:,} | {ggml:,} | {ggml / ours:.2f}x |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
