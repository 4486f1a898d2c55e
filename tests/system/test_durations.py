"""Durations as keep_alive takes them (system/durations.py), at their edges."""
import pytest

from stackd import config
from stackd.system.durations import MAX_SECONDS, NEVER, DurationError, seconds


@pytest.mark.parametrize("value, expected", [
    (0, 0.0), (300, 300.0), (1.5, 1.5), ("300", 300.0), ("5m", 300.0), ("1h30m", 5400.0),
    ("90s", 90.0), ("500ms", 0.5), ("0", 0.0), ("0s", 0.0), (" 2m ", 120.0),
    (-1, NEVER), ("-1", NEVER), ("-5m", NEVER), (MAX_SECONDS, MAX_SECONDS)])
def test_durations(value, expected):
    assert seconds(value) == expected


@pytest.mark.parametrize("value", ["", "soon", "5x", "m5", "5 m", "1h-3m", True, None, [], {},
                                   float("nan"), float("inf"), MAX_SECONDS + 1, "1" * 40])
def test_what_is_not_a_duration(value):
    with pytest.raises(DurationError):
        seconds(value)


@pytest.mark.parametrize("toml, expected", [('"5m"', 300.0), ("0", 0.0), ("-1", NEVER), ("90", 90.0),
                                            ("2.5", 2.5)])
def test_the_setting_takes_a_duration(tmp_path, toml, expected):
    (tmp_path / "config.toml").write_text(f"[models]\nkeep_alive = {toml}\n")
    assert config.load({"data_dir": str(tmp_path)}, environ={})["models.keep_alive"] == expected


def test_the_default_keep_alive_is_five_minutes_as_ollamas(tmp_path):
    assert config.load({"data_dir": str(tmp_path)}, environ={})["models.keep_alive"] == 300.0


def test_the_setting_from_the_environment(tmp_path):
    settings = config.load({"data_dir": str(tmp_path)}, environ={"STACKD_MODELS_KEEP_ALIVE": "10m"})
    assert settings["models.keep_alive"] == 600.0


@pytest.mark.parametrize("toml", ['"soon"', "true"])
def test_a_bad_keep_alive_setting_is_refused(tmp_path, toml):
    (tmp_path / "config.toml").write_text(f"[models]\nkeep_alive = {toml}\n")
    with pytest.raises(config.ConfigError, match="keep_alive"):
        config.load({"data_dir": str(tmp_path)}, environ={})


@pytest.mark.parametrize("value, ok", [(0.0, True), (0.5, True), (-0.5, False)])
def test_load_wait_is_zero_or_more(tmp_path, value, ok):
    (tmp_path / "config.toml").write_text(f"[models]\nload_wait = {value}\n")
    if ok:
        assert config.load({"data_dir": str(tmp_path)}, environ={})["models.load_wait"] == value
    else:
        with pytest.raises(config.ConfigError, match="load_wait"):
            config.load({"data_dir": str(tmp_path)}, environ={})
