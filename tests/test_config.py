import pytest

from stackd import config


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_defaults_bind_loopback(tmp_path):
    settings = config.load({"data_dir": str(tmp_path)}, environ={})
    assert settings["host"] == "127.0.0.1"
    assert (settings["inference_port"], settings["cluster_port"]) == (8080, 5381)
    assert settings["rate_limits"] == {"inference": 100, "cluster": 1000, "refusal_delay": 1.0}
    assert settings.limits().max_head_bytes == 16 * 1024


def test_precedence_file_then_env_then_flags(tmp_path):
    path = write(tmp_path, "inference_port = 1111\ncluster_port = 2222\n[http]\nmax_connections = 10\n")
    env = {"STACKD_CLUSTER_PORT": "3333", "STACKD_HTTP_MAX_CONNECTIONS": "20"}
    settings = config.load({"config": path, "data_dir": str(tmp_path), "cluster_port": 4444}, env)
    assert settings["inference_port"] == 1111          # file
    assert settings["http.max_connections"] == 20      # env over file
    assert settings["cluster_port"] == 4444            # flag over env


def test_config_toml_in_data_dir_is_found(tmp_path):
    write(tmp_path, "[rate_limits]\ninference = 7\n[rate_limits.keys.ci]\ninference = 70\n")
    settings = config.load({"data_dir": str(tmp_path)}, environ={})
    assert settings["rate_limits.inference"] == 7
    assert settings.per_key_limits == {"ci": {"inference": 70}}


@pytest.mark.parametrize("text,needle", [
    ("no_such = 1\n", "unknown setting"),
    ("inference_port = 'x'\n", "expected int"),
    ("inference_port = 70000\n", "not a TCP port"),
    ("[http]\nmax_connections = 0\n", "must be positive"),
    ("[rate_limits]\ninference = -1\n", "unlimited"),
    ("[debug]\ntrace_reply_timeout = 0\n", "trace_reply_timeout: must be positive"),
    ("[rate_limits.keys.ci]\nbogus = 1\n", "known group"),
    ("[rate_limits.keys.ci]\nrefusal_delay = 1\n", "known group"),   # a setting, not a group
    ("not toml at all [", "cannot read"),
    ("[engine]\nomp_wait_policy = 'spin'\n", "auto, passive, active or inherit"),
    ("[engine]\nembedding_nice = 20\n", "from 0 to 19"),
    ("[engine]\nembedding_nice = -1\n", "from 0 to 19"),
    ("[engine]\nkv_type = 'q4_0'\n", "engine.kv_type: must be f16 or q8_0"),
    ("[engine]\nkv_commit = 'later'\n", "engine.kv_commit: must be lazy or eager"),
    ("[engine]\nbatch_invariant = 'yes'\n", "engine.batch_invariant: expected bool"),
    ("[engine]\nbatch_invariant = true\nkernels = 'off'\n", "engine.batch_invariant: needs engine.kernels"),
    ("[engine]\nkernels = 'avx3'\n", "engine.kernels: must be auto, off, or a code path"),
    ("[models]\nprompt_cache_mb = -1\n", "models.prompt_cache_mb: must be 0 \\(off\\) or more"),
    ("[models]\nprompt_cache_min_tokens = 0\n", "models.prompt_cache_min_tokens: must be positive"),
    ("[models]\nprompt_cache_preload = -1\n", "models.prompt_cache_preload: must be 0 \\(none\\) to 64"),
    ("[models]\nprompt_cache_preload = 65\n", "models.prompt_cache_preload: must be 0 \\(none\\) to 64"),
])
def test_bad_files_are_refused_with_a_reason(tmp_path, text, needle):
    with pytest.raises(config.ConfigError, match=needle):
        config.load({"config": write(tmp_path, text), "data_dir": str(tmp_path)}, environ={})


def test_bad_environment_value_is_refused(tmp_path):
    with pytest.raises(config.ConfigError, match="STACKD|http.access_log"):
        config.load({"data_dir": str(tmp_path)}, environ={"STACKD_HTTP_ACCESS_LOG": "maybe"})


def test_engine_thread_settings_at_their_edges(tmp_path):
    text = "[engine]\nomp_wait_policy = 'inherit'\nembedding_nice = 19\n"
    settings = config.load({"config": write(tmp_path, text), "data_dir": str(tmp_path)}, environ={})
    assert settings["engine.omp_wait_policy"] == "inherit" and settings["engine.embedding_nice"] == 19
    defaults = config.load({"data_dir": str(tmp_path / "d")}, environ={})
    assert defaults["engine.omp_wait_policy"] == "auto" and defaults["engine.embedding_nice"] == 5


def test_batch_invariance_is_off_unless_asked_for(tmp_path):
    assert config.load({"data_dir": str(tmp_path / "d")}, environ={})["engine.batch_invariant"] is False
    settings = config.load({"config": write(tmp_path, "[engine]\nbatch_invariant = true\n"),
                            "data_dir": str(tmp_path / "d")}, environ={})
    assert settings["engine.batch_invariant"] is True


def test_the_kv_type_setting_defaults_to_f16_and_takes_q8_0(tmp_path):
    assert config.load({"data_dir": str(tmp_path / "d")}, environ={})["engine.kv_type"] == "f16"
    settings = config.load({"config": write(tmp_path, "[engine]\nkv_type = 'q8_0'\n"),
                            "data_dir": str(tmp_path)}, environ={})
    assert settings["engine.kv_type"] == "q8_0"


def test_the_kv_commit_setting_defaults_to_lazy_and_takes_eager(tmp_path):
    assert config.load({"data_dir": str(tmp_path / "d")}, environ={})["engine.kv_commit"] == "lazy"
    settings = config.load({"data_dir": str(tmp_path / "d")}, environ={"STACKD_ENGINE_KV_COMMIT": "eager"})
    assert settings["engine.kv_commit"] == "eager"


def test_the_prompt_cache_settings_at_their_edges(tmp_path):
    defaults = config.load({"data_dir": str(tmp_path / "d")}, environ={})
    assert (defaults["models.prompt_cache_mb"], defaults["models.prompt_cache_min_tokens"]) == (1024, 512)
    assert defaults["models.prompt_cache_preload"] == 2
    settings = config.load({"config": write(tmp_path, "[models]\nprompt_cache_mb = 0\nprompt_cache_min_tokens = 1\n"
                                                      "prompt_cache_preload = 0\n"),
                            "data_dir": str(tmp_path)}, environ={})
    assert (settings["models.prompt_cache_mb"], settings["models.prompt_cache_min_tokens"]) == (0, 1)
    assert settings["models.prompt_cache_preload"] == 0
    top = config.load({"config": write(tmp_path, "[models]\nprompt_cache_preload = 64\n"),
                       "data_dir": str(tmp_path)}, environ={})
    assert top["models.prompt_cache_preload"] == 64


def test_a_kernel_path_can_be_forced(tmp_path):
    """engine.kernels names a code path: what a CPU without AVX-512 runs, on one that has it."""
    settings = config.load({"config": write(tmp_path, "[engine]\nkernels = 'avx2'\n"),
                            "data_dir": str(tmp_path)}, environ={})
    assert settings["engine.kernels"] == "avx2"


@pytest.mark.parametrize("name, low, high", [("dashboard_interval", 0.5, 60.0), ("dashboard_samples", 10, 100_000),
                                             ("dashboard_devices", 1, 1000), ("dashboard_days", 1, 90)])
def test_the_console_dashboards_bounds_hold_at_their_edges(tmp_path, name, low, high):
    for edge in (low, high):
        settings = config.load({"config": write(tmp_path, f"[console]\n{name} = {edge}\n"),
                                "data_dir": str(tmp_path)}, environ={})
        assert settings[f"console.{name}"] == edge
    step = 0.1 if isinstance(low, float) else 1
    for past in (low - step, high + step):
        with pytest.raises(config.ConfigError, match=f"console.{name}"):
            config.load({"config": write(tmp_path, f"[console]\n{name} = {past}\n"),
                         "data_dir": str(tmp_path)}, environ={})


def test_the_ollama_port_is_off_unless_turned_on_and_its_settings_are_checked(tmp_path):
    settings = config.load({"data_dir": str(tmp_path)}, environ={})
    assert settings["ollama.enabled"] is False and settings["ollama.port"] == 11434
    assert settings["ollama.anonymous_networks"] == []             # every request needs a key
    on = config.load({"data_dir": str(tmp_path), "ollama.enabled": True, "ollama.port": 0},
                     environ={"STACKD_OLLAMA_ANONYMOUS_NETWORKS": "192.168.1.0/24, ::1"})
    assert on["ollama.enabled"] and on["ollama.anonymous_networks"] == ["192.168.1.0/24", "::1"]
    for text, needle in (("[ollama]\nport = 70000\n", "ollama.port"), ("[ollama]\nmax_blob_mb = 0\n", "max_blob_mb"),
                         ("[ollama]\nanonymous_networks = [\"lan\"]\n", "anonymous_networks"),
                         ("[ollama]\nanonymous_rate_limit = -1\n", "anonymous_rate_limit")):
        with pytest.raises(config.ConfigError, match=needle):
            config.load({"config": write(tmp_path, text), "data_dir": str(tmp_path)}, environ={})
