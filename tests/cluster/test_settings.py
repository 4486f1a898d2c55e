"""The cluster.* settings: validation, and the secret read once and kept out of `values`."""
from __future__ import annotations

import pytest

from stackd import config
from stackd.config import ConfigError

SECRET = "s" * 16


def load(**env) -> config.Settings:
    return config.load({"data_dir": "/nonexistent-stackd"}, {f"STACKD_CLUSTER_{k.upper()}": v
                                                            for k, v in env.items()})


def test_no_cluster_settings_is_a_one_node_leader():
    settings = load()
    assert settings["cluster.role"] == "leader" and settings.cluster_secret is None
    assert settings["cluster.rpc_port"] == 50052


def test_the_secret_is_read_and_blanked():
    settings = load(secret=f"  {SECRET}\n")
    assert settings.cluster_secret == SECRET.encode()
    assert SECRET not in repr(settings.values)


def test_the_secret_file(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        load(secret_file=str(path))
    path.chmod(0o600)
    assert load(secret_file=str(path)).cluster_secret == SECRET.encode()
    path.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load(secret_file=str(path))
    with pytest.raises(ConfigError, match="cannot read"):
        load(secret_file=str(tmp_path / "missing"))


@pytest.mark.parametrize("env,message", [
    ({"role": "boss"}, "leader or follower"),
    ({"role": "follower", "secret": SECRET}, "needs the leader"),
    ({"role": "follower", "leader": "http://10.0.0.1:5381"}, "needs the cluster secret"),
    ({"leader": "http://10.0.0.1:5381", "secret": SECRET}, "only a follower"),
    ({"role": "follower", "leader": "https://10.0.0.1:5381", "secret": SECRET}, "http://host:port"),
    ({"role": "follower", "leader": "http://10.0.0.1", "secret": SECRET}, "http://host:port"),
    ({"advertise": "10.0.0.2:5381"}, "http://host:port"),
    ({"secret": "s" * 15}, "at least 16"),
    ({"secret": SECRET, "secret_file": "/x"}, "one of them"),
    ({"rpc_port": "0"}, "not a TCP port"),
    ({"rpc_port": "65536"}, "not a TCP port"),
])
def test_bad_cluster_settings_are_refused_without_quoting_the_secret(env, message):
    with pytest.raises(ConfigError, match=message) as err:
        load(**env)
    assert SECRET not in str(err.value) and "s" * 15 not in str(err.value)


def test_a_wildcard_host_needs_an_advertised_url():
    env = {"STACKD_HOST": "0.0.0.0", "STACKD_CLUSTER_SECRET": SECRET}
    with pytest.raises(ConfigError, match="cluster.advertise"):
        config.load({"data_dir": "/nonexistent-stackd"}, env)
    env["STACKD_CLUSTER_ADVERTISE"] = "http://10.0.0.1:5381"
    assert config.load({"data_dir": "/nonexistent-stackd"}, env)["cluster.advertise"]


def test_edges_of_rpc_port():
    assert load(rpc_port="1")["cluster.rpc_port"] == 1
    assert load(rpc_port="65535")["cluster.rpc_port"] == 65535
