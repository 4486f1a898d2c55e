"""engine.kernels: the setting, and what registering does to the process's ggml."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stackd import config
from stackd.engine import accel

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs in a fresh process (registration is per process): registers per argv[1] and prints
# what accel reports and the devices in the registry libllama reads.
PROBE = """
import ctypes, json, os, sys
from stackd.engine import accel
import llama_cpp
result = accel.register(sys.argv[1])
ggml = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml.so.0"))
ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
ggml.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
ggml.ggml_backend_dev_name.restype = ctypes.c_char_p
ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
devices = [(ggml.ggml_backend_dev_name(ggml.ggml_backend_dev_get(i)).decode(),
            ggml.ggml_backend_dev_type(ggml.ggml_backend_dev_get(i)))
           for i in range(ggml.ggml_backend_dev_count())]
print(json.dumps({"path": result, "registered": accel.registered(), "devices": devices}))
"""
ACCEL = 3  # GGML_BACKEND_DEVICE_TYPE_ACCEL (CPU, GPU, IGPU, ACCEL, ...)


def probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def test_setting_defaults_to_auto(tmp_path):
    assert config.load({"data_dir": str(tmp_path)}, environ={})["engine.kernels"] == "auto"


def test_setting_from_environment(tmp_path):
    settings = config.load({"data_dir": str(tmp_path)}, environ={"STACKD_ENGINE_KERNELS": "off"})
    assert settings["engine.kernels"] == "off"


def test_setting_refuses_other_values(tmp_path):
    with pytest.raises(config.ConfigError, match="engine.kernels"):
        config.load({"data_dir": str(tmp_path)}, environ={"STACKD_ENGINE_KERNELS": "avx3"})   # a path that is not ours


def test_off_registers_nothing():
    result = probe("off")
    assert result["path"] is None and result["registered"] is None
    assert "STACKD" not in [name for name, _ in result["devices"]]


def test_auto_registers_an_accel_device_in_llamas_ggml():
    if not accel.cpu_supports("avx2"):
        pytest.skip("this CPU lacks AVX2: auto registers nothing")
    result = probe("auto")
    assert result["path"] == result["registered"] in ("avx2", "avx512-vnni")
    assert ["STACKD", ACCEL] in result["devices"]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="engine.kernels"):
        accel.register("fastest")


def serve_and_read_maps(tmp_path, kernels: str, kv_commit: str = "lazy") -> tuple[str, list[str]]:
    """Start the daemon (engines in worker processes, the default) with the chat model, and
    return its own memory map and its children's."""
    import signal
    data = tmp_path / kernels
    data.mkdir()
    (data / "config.toml").write_text(f'[engine]\nkernels = "{kernels}"\nkv_commit = "{kv_commit}"\n'
                                      '[models]\npreload = ["smollm2-135m-instruct"]\n')
    proc = subprocess.Popen([sys.executable, "-m", "stackd", "serve", "--data-dir", str(data),
                             "--inference-port", "0", "--cluster-port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:                  # no time bound: a slow machine is still right
            if "loaded chat model" in line:
                break
        children = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        own = open(f"/proc/{proc.pid}/maps").read()
        return own, [open(f"/proc/{c}/maps").read() for c in children]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def test_daemon_registers_in_the_engine_worker_only(tmp_path):
    if not accel.cpu_supports("avx2"):
        pytest.skip("this CPU lacks AVX2: auto registers nothing")
    own, workers = serve_and_read_maps(tmp_path, "auto")
    assert "libstackd_kernels.so" not in own
    assert workers and all("libstackd_kernels.so" in maps for maps in workers)
    # A lazy KV cache loads the library for its buffer hook alone (test_kv_commit.py): eager here.
    own, workers = serve_and_read_maps(tmp_path, "off", kv_commit="eager")
    assert workers and not any("libstackd_kernels.so" in maps for maps in workers)


def test_the_chunked_form_s_runs_follow_the_model_and_are_refused_off_their_steps():
    """kernels/README.md, "The arithmetic", the chunked form: attn_output's run the largest power
    of two dividing its K, 32 to 256, ffn_down's the longest of 1,024 or 512 that cuts its K into
    at least 8, else 256; a shard's worker sets multiples of 32 and 256 up to 65,536."""
    assert [accel.ffn_chunk_columns(n) for n in (1536, 8192, 14336, 5632, 11008, 100)] == \
        [256, 1024, 1024, 512, 256, 256]
    assert [accel.attn_chunk_columns(k) for k in (576, 2048, 4096, 896, 2560, 96, 0)] == \
        [64, 256, 256, 128, 256, 32, 32]
    assert accel.shard_runs(576, 1536) == (64, 256) and accel.shard_runs(2048, 8192) == (256, 1024)
    assert accel.shard_runs(0, 1536) is None and accel.shard_runs(576, 0) is None   # a whole model
    if not accel.cpu_supports("avx2"):
        pytest.skip("the kernels do not load on this CPU")
    for attn, ffn in ((0, 256), (48, 256), (64, 255), (64, 300), (64, 65536 + 256), (65536 + 32, 256), (-32, -256)):
        with pytest.raises(ValueError):
            accel.set_runs(attn, ffn)
    accel.set_runs(65536, 65536)
    accel.set_runs(0, 0)                                                 # each weight's own again
