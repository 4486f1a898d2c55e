"""`make wheels ARCH=aarch64`'s dist-aarch64/, on this x86 machine.

Cheap, marked `cross` (tests/image's stage of `make test`, when dist-aarch64/ is there): every
library in the llama-cpp-python and stackd wheels is an aarch64 ELF file, ggml's ARM CPU
variants and the RPC backend are in, each wheel is tagged for what it holds, and pip, told it
installs for Debian bookworm's arm64 Python 3.11, resolves stackd from the folder alone.

Slow, marked `aarch64_full` (`make test-aarch64`): an arm64 Debian bookworm root
(tests/image/arm64_root.py) where the set installs with `pip install --no-index` and
`stackd --help` runs, then the engine under qemu-aarch64 (`-cpu cortex-a76`, a Raspberry Pi 5's
core): the default chat model (SmolLM2-135M, Q4_1) loads with engine.kernels = auto on our
neon-dotprod path, answers greedily, the same tokens run to run, the prompts sharing a step
giving what each gives alone, and with kernels off (ggml's NEON) agreeing up to near ties, as
tests/kernels/test_model.py holds it on x86 (the texts are not identical there either); and a
two-node tensor split of aarch64 workers on loopback (tests/image/aarch64_split.py) answering
byte for byte as one aarch64 node, as tests/engine/test_tensor_e2e.py holds it on x86.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

from tests.image import arm64_root

ROOT = arm64_root.ROOT
DIST = arm64_root.DIST
EM_AARCH64 = 183
# ggml's ARM variants this build ships (native/llama_wheel.py: GCC 12 cannot build armv9.2's)
VARIANTS = ("armv8.0_1", "armv8.2_1", "armv8.2_2", "armv8.2_3", "armv8.6_1", "armv8.6_2")
WHEELS = __import__("runpy").run_path(os.path.join(ROOT, "packaging", "wheels.py"))
PROMPTS, TOKENS = 2, 24


def wheel(pattern: str) -> str:
    found = glob.glob(os.path.join(DIST, pattern))
    if not found:
        pytest.skip(f"no dist-aarch64/{pattern}: make wheels ARCH=aarch64 builds it")
    (path,) = found
    return path


def elf_machines(path: str) -> dict[str, int]:
    with zipfile.ZipFile(path) as z:
        return {name: int.from_bytes(z.read(name)[18:20], "little") for name in z.namelist()
                if re.search(r"\.so(\.\d+)*$", name)}


@pytest.mark.cross
def test_llama_cpp_python_is_aarch64_with_every_cpu_variant_and_rpc():
    path = wheel("llama_cpp_python-*.whl")
    machines = elf_machines(path)
    assert machines and set(machines.values()) == {EM_AARCH64}, machines
    names = {os.path.basename(name) for name in machines}
    assert {f"libggml-cpu-{v}.so" for v in VARIANTS} <= names, sorted(names)
    assert {"libggml-rpc.so", "libggml-base.so", "libllama.so"} <= {re.sub(r"\.so.*", ".so", n) for n in names}
    # tagged manylinux for the glibc its libraries need, which bookworm's (2.36) covers
    tag = re.fullmatch(r"llama_cpp_python-[\d.]+-py3-none-manylinux_2_(\d+)_aarch64\.whl", os.path.basename(path))
    assert tag and 17 <= int(tag.group(1)) <= 36, os.path.basename(path)


@pytest.mark.cross
def test_stackd_is_aarch64_with_every_native_module():
    path = wheel("stackd-*.whl")
    assert os.path.basename(path) == "stackd-0.1.0-cp311-cp311-linux_aarch64.whl"
    machines = elf_machines(path)
    expected = WHEELS["native_modules"](".cpython-311-aarch64-linux-gnu.so", "")
    assert {name.removeprefix("stackd/") for name in machines} == {n.lstrip("/") for n in expected}
    assert set(machines.values()) == {EM_AARCH64}, machines
    with zipfile.ZipFile(path) as z:
        text = z.read("stackd-0.1.0.dist-info/WHEEL").decode()
    assert "Tag: cp311-cp311-linux_aarch64" in text and "Root-Is-Purelib: false" in text


@pytest.mark.cross
def test_every_wheel_is_for_aarch64_or_any_platform():
    wheel("stackd-*.whl")
    names = [os.path.basename(w) for w in glob.glob(os.path.join(DIST, "*.whl"))]
    wrong = [n for n in names if not re.search(r"-(any|[a-z0-9_.]*aarch64)\.whl$", n)]
    assert wrong == [] and len(names) > 20, names


@pytest.mark.cross
def test_pip_resolves_stackd_from_dist_alone_for_bookworm_arm64():
    wheel("stackd-*.whl")
    with tempfile.TemporaryDirectory() as target:
        done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "install",
                               "--dry-run", "--target", target, *WHEELS["target_options"]("aarch64"),
                               "--no-index", "--find-links", DIST, "stackd", "stackd-default-models"],
                              capture_output=True, text=True, env=pip_alone())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # pip names a wheel's project as its file spells it (llama_cpp_python) or normalized
    assert "Would install" in done.stdout and re.search(r"llama[-_]cpp[-_]python-0\.3\.36", done.stdout), done.stdout


def pip_alone() -> dict:
    """This environment without the machine's pip settings (a find-links folder of its own):
    the set must resolve from dist-aarch64/ alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return dict(env, PIP_CONFIG_FILE=os.devnull)


# ---- under emulation ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def installed():
    why = arm64_root.missing()
    if why:
        pytest.skip(why)
    path = arm64_root.installed()
    checks = os.path.join(path, "opt", "checks")
    os.makedirs(os.path.join(checks, "testing"), exist_ok=True)
    for source, target in (("tests/image/aarch64_chat.py", "aarch64_chat.py"),
                           ("tests/image/aarch64_split.py", "aarch64_split.py"),
                           ("tests/kernels/greedy_run.py", "greedy_run.py"),
                           ("testing/__init__.py", "testing/__init__.py"),
                           ("testing/kernels_check.py", "testing/kernels_check.py")):
        shutil.copy2(os.path.join(ROOT, source), os.path.join(checks, target))
    return path


def in_root(path: str, *command: str, cpu: str = "cortex-a76", timeout: int = 3600) -> subprocess.CompletedProcess:
    """`command` in the root under qemu-aarch64 -cpu `cpu`, with /proc mounted for it."""
    proc = os.path.join(path, "proc")
    subprocess.run(["mount", "-t", "proc", "proc", proc], check=True)
    try:
        return arm64_root.chroot(path, *command, env={"QEMU_CPU": cpu, "PYTHONPATH": "/opt/checks"},
                                 capture_output=True, text=True, timeout=timeout)
    finally:
        subprocess.run(["umount", proc], check=True)


@pytest.mark.aarch64_full
def test_stackd_help_runs_in_the_arm64_root(installed):
    done = in_root(installed, f"{arm64_root.VENV}/bin/stackd", "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "serve" in done.stdout
    machine = in_root(installed, f"{arm64_root.VENV}/bin/python", "-c", "import platform; print(platform.machine())")
    assert machine.stdout.strip() == "aarch64"


def chat(installed: str, mode: str) -> dict:
    done = in_root(installed, f"{arm64_root.VENV}/bin/python", "/opt/checks/aarch64_chat.py", mode,
                   str(PROMPTS), str(TOKENS))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def chats(installed):
    runs = {"auto": chat(installed, "auto"), "again": chat(installed, "auto"), "off": chat(installed, "off")}
    for name, run in runs.items():   # which paths ran (pytest -rA or -s shows it)
        print(f"qemu-aarch64 -cpu cortex-a76, engine.kernels={'auto' if name == 'again' else name}: "
              f"our path {run['path']}, ggml's {run['ggml_cpu']}; {run['texts'][0]!r}")
    return runs


def ids(generation: list) -> list[int]:
    return [token for token, _, _ in generation]


@pytest.mark.aarch64_full
def test_kernels_auto_picks_the_dotprod_path_and_ggml_its_dotprod_variant(chats):
    assert chats["auto"]["path"] == "neon-dotprod"
    assert chats["off"]["path"] is None
    # a Cortex-A76 has the dot products and fp16 arithmetic, no SVE: ggml's armv8.2_2
    assert chats["auto"]["ggml_cpu"] == chats["off"]["ggml_cpu"] == "libggml-cpu-armv8.2_2.so"


@pytest.mark.aarch64_full
def test_the_model_answers_greedily_the_same_run_to_run(chats):
    for run in chats.values():
        assert all(len(g) == TOKENS for g in run["alone"] + run["together"])
        assert all(text.strip() for text in run["texts"]), run["texts"]
    assert [ids(g) for g in chats["again"]["alone"]] == [ids(g) for g in chats["auto"]["alone"]]
    assert chats["again"]["texts"] == chats["auto"]["texts"]


@pytest.mark.aarch64_full
def test_prompts_sharing_a_step_equal_each_alone_with_kernels_on(chats):
    assert [ids(g) for g in chats["auto"]["together"]] == [ids(g) for g in chats["auto"]["alone"]]


@pytest.mark.aarch64_full
def test_kernels_on_and_off_agree_up_to_near_ties(chats):
    from tests.kernels.test_model import assert_close
    for batching in ("alone", "together"):
        for ours, ggml in zip(chats["auto"][batching], chats["off"][batching]):
            assert_close(ours, ggml)


@pytest.mark.aarch64_full
def test_a_two_node_tensor_split_of_aarch64_workers_answers_as_one_node(installed):
    """Two aarch64 engine workers on loopback, each on half of the default model's tensors, the
    partial sums and logits exchanged by our kernels' NEON path: greedy text byte-equal to one
    aarch64 node's, and the same run to run."""
    done = in_root(installed, f"{arm64_root.VENV}/bin/python", "/opt/checks/aarch64_split.py", "2", "16")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"qemu-aarch64 -cpu cortex-a76, tensor split of 2: paths {run['paths']}; {run['split'][0]!r}")
    assert run["paths"] == ["neon-dotprod"] * 3
    assert all(text.strip() for text in run["split"])
    assert run["split"] == run["again"]
    assert run["split"] == run["one_node"]
    assert run["follower_status"] == 0
