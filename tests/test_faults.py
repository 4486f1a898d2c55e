"""Fault injection reaches a daemon only through its composition root (server/faults.py): no
configuration file or environment variable turns it on, and the test harness's entry point
(testing/serve.py) hands daemon.run exactly what a harness asked for."""
import pytest

from stackd import config
from stackd.faults import NONE, Faults

from testing import serve


def test_no_fault_is_on_by_default_and_a_worker_hears_of_none():
    assert NONE.for_worker() == {} and not NONE.worker_crashes()
    assert (NONE.link_delay_us, NONE.free_links, NONE.tp_full_rows, NONE.compute) == (0, False, False, 0.0)


def test_a_worker_hears_only_of_the_faults_asked_for():
    faults = Faults(free_links=True, compute=2.5)
    assert faults.for_worker() == {"free_links": True}            # compute is the daemon's own
    assert Faults(**faults.for_worker()).free_links is True       # what the worker rebuilds


def test_the_link_delay_runs_from_0_to_one_second():
    assert Faults(link_delay_us=1_000_000).for_worker() == {"link_delay_us": 1_000_000}
    for outside in (-1, 1_000_001):
        with pytest.raises(ValueError, match="link_delay_us"):
            Faults(link_delay_us=outside)


def test_a_config_file_cannot_turn_fault_injection_on(tmp_path):
    (tmp_path / "config.toml").write_text('[testing]\nworker_crash_file = "/tmp/x"\n')
    with pytest.raises(config.ConfigError, match="unknown setting 'testing.worker_crash_file'"):
        config.load({"data_dir": str(tmp_path)}, environ={})


def test_the_environment_cannot_either():
    settings = config.load({}, environ={"STACKD_TESTING_WORKER_CRASH_FILE": "/tmp/x",
                                        "STACKD_TESTING_LOOPBACK_PEERS": "f1=512"})
    assert "testing" not in settings.values


def test_the_harness_flags_round_trip_to_the_composition_root():
    injected = {"loopback_peers": "f1=512@2.5", "worker_crash_file": "/tmp/crash", "compute": 1.0,
                "link_delay_us": 30, "free_links": True, "tp_full_rows": False}
    flags = serve.flags(injected)
    assert "--tp-full-rows" not in flags and "--free-links" in flags
    options, rest = serve.parser().parse_known_args(flags + ["serve", "--data-dir", "d"])
    assert rest == ["serve", "--data-dir", "d"]
    assert {name: getattr(options, name) for name in serve.FLAGS} == injected
    assert serve.flags({}) == [] and serve.flags({"loopback_peers": "", "free_links": False}) == []
    with pytest.raises(ValueError, match="no injection 'crash'"):
        serve.flags({"crash": True})
