"""engine.kv_commit: a KV cache committed as its cells are written (lazy, the default) or all of
it when llama.cpp clears it at creation (eager). kernels/src/lazy_commit.h: once installed, a
ggml CPU buffer cleared to zero gives its whole pages back instead of writing them.

Each probe runs in a fresh process: the switch is per process, and memory is read from it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A ggml CPU buffer through ggml's public API: filled with 0xAB, cleared, then what it reads and
# how many of its pages are resident (mincore), for a few sizes and clear values.
BUFFER_PROBE = """
import ctypes, json, sys
from stackd.engine import accel
lib = accel.library()            # ggml's public API resolves through our library's dependencies
lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
lib.ggml_backend_buft_alloc_buffer.restype = ctypes.c_void_p
lib.ggml_backend_buft_alloc_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
lib.ggml_backend_buffer_get_base.restype = ctypes.c_void_p
lib.ggml_backend_buffer_get_base.argtypes = [ctypes.c_void_p]
lib.ggml_backend_buffer_clear.argtypes = [ctypes.c_void_p, ctypes.c_uint8]
lib.ggml_backend_buffer_free.argtypes = [ctypes.c_void_p]
libc = ctypes.CDLL(None)
PAGE = 4096

def resident(base, size):
    first, last = -(-base // PAGE) * PAGE, (base + size) // PAGE * PAGE
    vec = (ctypes.c_ubyte * ((last - first) // PAGE))()
    assert libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(last - first), vec) == 0
    return sum(v & 1 for v in vec), len(vec)

accel.commit_on_write(sys.argv[1])
out = {}
for size, value in [((8 << 20) + 123, 0), ((8 << 20) + 123, 7), (3 * PAGE + 5, 0)]:
    buf = lib.ggml_backend_buft_alloc_buffer(lib.ggml_backend_cpu_buffer_type(), size)
    base = lib.ggml_backend_buffer_get_base(buf)
    ctypes.memset(base, 0xAB, size)
    lib.ggml_backend_buffer_clear(buf, value)
    held = resident(base, size)          # before reading: a read maps the zero page, resident too
    data = ctypes.string_at(base, size)
    out[f"{size}/{value}"] = {"all_value": data.count(bytes([value])) == size, "resident": held}
    lib.ggml_backend_buffer_free(buf)
print(json.dumps(out))
"""

# The real chat model at the daemon's default slots, with kv_commit per argv[1]: the process's
# anonymous memory once loaded, greedy answers to short prompts and to long ones (most of a
# slot's cells written), and the anonymous memory after.
ENGINE_PROBE = """
import json, sys
sys.path.insert(0, ".")
from stackd.engine import accel
accel.commit_on_write(sys.argv[1])
accel.register("auto")
from stackd.engine.core import Engine
from stackd.store import defaults
from tests.engine.conftest import Driver, chat_prompt

def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

engine = Engine(defaults.smollm2_path(), slots=16, context_length=1024, batch=256, threads=2)
loaded = rss_anon()
driver = Driver(engine)
long_text = "Summarize: " + " ".join(f"item{i} is a thing" for i in range(120))
prompts = [chat_prompt(engine, t) for t in ["Hi", "What is 2+2?", long_text, "Name a colour."]]
# One at a time: a prefill's arithmetic depends on what shares its step (engine.batch_invariant
# is off), and timing must not decide that here.
texts = []
for prompt in prompts:
    rid = driver.submit(prompt, max_tokens=24)
    texts.append(driver.wait([rid])[rid]["text"].decode("utf-8", "replace"))
print(json.dumps({"loaded": loaded, "after": rss_anon(), "long_prompt": len(prompts[2]), "texts": texts}))
engine.close()
"""


def probe(script: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script, mode], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def test_a_cleared_buffer_reads_zero_and_holds_no_whole_page_once_lazy():
    lazy = probe(BUFFER_PROBE, "lazy")["8388731/0"]
    assert lazy["all_value"]
    held, pages = lazy["resident"]
    assert pages >= 2047 and held == 0            # 8 MiB: 2,047 or 2,048 whole pages, as the base falls


def test_a_cleared_buffer_stays_resident_when_eager():
    eager = probe(BUFFER_PROBE, "eager")["8388731/0"]
    held, pages = eager["resident"]
    assert eager["all_value"] and pages >= 2047 and held == pages


@pytest.mark.parametrize("key", ["8388731/7", "12293/0"])
def test_a_clear_to_another_value_or_of_a_small_buffer_writes_it(key):
    result = probe(BUFFER_PROBE, "lazy")[key]
    assert result["all_value"]
    held, pages = result["resident"]
    assert held == pages                          # written, as ggml's memset does


@pytest.fixture(scope="module")
def engines():
    return {mode: probe(ENGINE_PROBE, mode) for mode in ("lazy", "eager")}


def test_a_lazy_cache_takes_its_memory_as_it_fills(engines):
    lazy, eager = engines["lazy"], engines["eager"]
    # The KV cache: 30 layers x (192 K + 192 V values, f16) x 16 x 1,024 cells = 377 MB. Eager,
    # all of it is resident at load; lazy, none of it (its other buffers are the same).
    assert eager["loaded"] - lazy["loaded"] > 300e6, engines
    assert lazy["after"] > lazy["loaded"]         # the answered prompts' cells were written
    assert eager["after"] - lazy["after"] > 250e6, engines
    assert engines["lazy"]["long_prompt"] > 400


def test_a_lazy_cache_answers_as_an_eager_one(engines):
    assert engines["lazy"]["texts"] == engines["eager"]["texts"]
    assert all(engines["lazy"]["texts"])
