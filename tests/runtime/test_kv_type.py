"""The KV cache's type (engine.kv_type, a load's options.kv_type) in the memory estimate, in
admission and in the engine's parameters, without a model (tests/engine/test_kv_type.py runs one)."""
import asyncio

import pytest

from stackd.engine.config import KV_TYPES, EngineConfig, kv_bytes
from stackd.http.errors import ErrorKind
from stackd.runtime import planner as planner_module
from stackd.runtime.planner import BUFFER_OVERHEAD, MIB, kv_bytes_per_token
from stackd.runtime.registry import ModelRegistry
from stackd.store.store import Manifest
from tests.answers import raises_http

# SmolLM2-135M's layout: 30 layers, 192 K (and V) values a token per layer.
MANIFEST = Manifest(id="m", file="blobs/sha256-" + "0" * 64, size=100 * MIB, sha256="0" * 64,
                    architecture="llama", kind="chat", quantization="Q4_1", parameter_count=1,
                    context_length=8192, n_layer=30, n_embd=576, n_head_kv=3, n_head=9)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def registry(loop, kv_type="f16", slots=16) -> ModelRegistry:
    return ModelRegistry(loop, store=None, config=EngineConfig(slots=slots, kv_type=kv_type),
                         memory_reserve=0)


def test_q8_0_stores_34_bytes_per_32_values_against_f16s_64():
    assert kv_bytes(192, "f16") == 384 and kv_bytes(192, "q8_0") == 6 * 34
    assert kv_bytes_per_token(MANIFEST, "q8_0") == 2 * 30 * 204
    assert kv_bytes_per_token(MANIFEST) == kv_bytes_per_token(MANIFEST, "f16") == 2 * 30 * 384


def test_the_estimate_follows_the_load_then_the_setting(loop):
    f16, q8 = registry(loop, "f16").planner, registry(loop, "q8_0").planner
    assert f16.estimate(MANIFEST, 2048)["kv_cache"] == 16 * 2048 * 2 * 30 * 384
    assert f16.estimate(MANIFEST, 2048, "q8_0")["kv_cache"] == 16 * 2048 * 2 * 30 * 204
    assert q8.estimate(MANIFEST, 2048)["kv_cache"] == 16 * 2048 * 2 * 30 * 204
    assert q8.estimate(MANIFEST, 2048, "f16")["kv_cache"] == 16 * 2048 * 2 * 30 * 384


def test_a_load_that_fits_with_q8_0_and_not_with_f16(loop, monkeypatch):
    planner = registry(loop).planner
    context = 8192
    q8 = sum(planner.estimate(MANIFEST, context, "q8_0").values())
    f16 = sum(planner.estimate(MANIFEST, context, "f16").values())
    assert f16 - q8 > 1000 * MIB                       # 16 slots of 8192 tokens: 1.4 GiB apart
    monkeypatch.setattr(planner_module.readings, "meminfo",
                        lambda: {"MemTotal": 64 << 30, "MemAvailable": q8})
    planner.admit(MANIFEST, context, "q8_0")           # exactly fits
    with raises_http() as refused:
        planner.admit(MANIFEST, context, "f16")
    assert refused.value.kind is ErrorKind.INSUFFICIENT_MEMORY
    assert f"KV cache {(f16 - 100 * MIB - BUFFER_OVERHEAD) // MIB} as f16" in refused.value.message
    monkeypatch.setattr(planner_module.readings, "meminfo",
                        lambda: {"MemTotal": 64 << 30, "MemAvailable": q8 - 1})
    with raises_http():
        planner.admit(MANIFEST, context, "q8_0")       # one byte short


def test_the_engine_gets_the_ggml_type_and_an_embedding_model_keeps_f16():
    config = EngineConfig(kv_type="q8_0")
    assert config.params("m.gguf", False, 512)["kv_type"] == KV_TYPES["q8_0"] == 8
    assert config.params("m.gguf", False, 512, "f16")["kv_type"] == KV_TYPES["f16"] == 1
    assert config.params("m.gguf", True, 512, "q8_0")["kv_type"] == 1
    assert EngineConfig().params("m.gguf", False, 512)["kv_type"] == 1
