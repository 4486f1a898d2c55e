"""What the runtime hands a model's engine for the prompt cache (server/runtime/prompt_cache.py):
its directory under the store, a key that changes with the model and the kernels' arithmetic,
the settings in bytes; nothing for an embedding model or with the cache off."""
import os

from stackd.engine.config import EngineConfig
from stackd.runtime.prompt_cache import MIB, PromptCacheConfig
from stackd.store.store import ModelStore

SHA = "ab" * 32


def config_for(tmp_path, **models) -> PromptCacheConfig:
    settings = {"prompt_cache_mb": 1024, "prompt_cache_min_tokens": 512, "disk_reserve_mb": 100,
                "prompt_cache_preload": 2} | models
    return PromptCacheConfig.from_settings(ModelStore(str(tmp_path / "data")), settings)


def test_a_chat_model_gets_its_directory_budget_and_key(tmp_path):
    cache = config_for(tmp_path)
    params = cache.params(SHA, "chat", EngineConfig())
    store = ModelStore(str(tmp_path / "data"))
    assert params["prompt_cache_dir"] == store.prompt_cache_dir(SHA)
    assert params["prompt_cache_root"] == store.prompt_cache == os.path.dirname(params["prompt_cache_dir"])
    assert params["prompt_cache_bytes"] == 1024 * MIB and params["prompt_cache_disk_reserve"] == 100 * MIB
    assert params["prompt_cache_min_tokens"] == 512 and params["prompt_cache_preload"] == 2
    assert f"model={SHA}" in params["prompt_cache_key"]


def test_the_key_changes_with_the_model_and_the_kernels_arithmetic(tmp_path):
    cache = config_for(tmp_path)
    base = cache.key(SHA, EngineConfig())
    assert cache.key("cd" * 32, EngineConfig()) != base
    assert cache.key(SHA, EngineConfig(kernels="off")) != base
    assert cache.key(SHA, EngineConfig(batch_invariant=True)) != base
    assert cache.key(SHA, EngineConfig(flash_attn="off")) != base
    assert cache.key(SHA, EngineConfig()) == base          # and only with them


def test_nothing_for_an_embedding_model_or_with_the_cache_off(tmp_path):
    assert config_for(tmp_path).params(SHA, "embedding", EngineConfig()) == {}
    assert config_for(tmp_path, prompt_cache_mb=0).params(SHA, "chat", EngineConfig()) == {}
    assert PromptCacheConfig().params(SHA, "chat", EngineConfig()) == {}


def test_the_process_that_registers_the_kernels_adds_their_code_path():
    """The daemon's key names engine.kernels; the path `auto` resolves to is the registering
    process's to add (accel.keyed), so the daemon never loads the kernels' library."""
    from stackd.engine import accel
    keyed = accel.keyed({"prompt_cache_key": "k", "n_ctx": 8})
    assert keyed == {"prompt_cache_key": f"k;path={accel.registered() or 'none'}", "n_ctx": 8}
    assert accel.keyed({"n_ctx": 8}) == {"n_ctx": 8}          # the cache off: nothing to key
