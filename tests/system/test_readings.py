import os

from stackd.system import readings


def sensor(root, rel, millidegrees):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{millidegrees}\n")


def test_hottest_of_thermal_zones_and_hwmon(tmp_path):
    sensor(tmp_path, "class/thermal/thermal_zone0/temp", 41000)
    sensor(tmp_path, "class/thermal/thermal_zone1/temp", 55500)
    sensor(tmp_path, "class/hwmon/hwmon2/temp3_input", 48000)
    assert readings.read_hottest(str(tmp_path)) == 55.5


def test_no_sensors_is_none_and_broken_ones_are_skipped(tmp_path):
    assert readings.read_hottest(str(tmp_path)) is None
    sensor(tmp_path, "class/thermal/thermal_zone0/temp", "garbage")
    sensor(tmp_path, "class/hwmon/hwmon0/temp1_input", 999999)       # implausible
    assert readings.read_hottest(str(tmp_path)) is None


def test_thermometer_caches_between_reads():
    calls = []
    now = [0.0]
    thermometer = readings.Thermometer(read=lambda: calls.append(1) or 40.0, clock=lambda: now[0])
    assert thermometer.celsius() == 40.0 and thermometer.celsius() == 40.0
    assert len(calls) == 1
    now[0] += readings.SENSOR_CACHE_SECONDS + 0.1
    thermometer.celsius()
    assert len(calls) == 2


def test_memory_readings_are_plausible():
    memory = readings.meminfo()
    assert 0 < memory["MemAvailable"] <= memory["MemTotal"]
    assert readings.ram_gb(memory["MemTotal"]) >= 1
    assert readings.ram_gb(int(7.6 * readings.GIB)) == 8


def test_pss_is_read_at_most_once_a_window_and_forgotten_after(monkeypatch):
    reads = []
    monkeypatch.setattr(readings, "_read_pss", lambda pid: reads.append(pid) or 1000 + len(reads))
    monkeypatch.setattr(readings, "_pss_cache", {})
    now = [100.0]
    clock = lambda: now[0]                                     # noqa: E731
    assert readings.pss_bytes(7, clock) == 1001 and readings.pss_bytes(7, clock) == 1001
    assert readings.pss_bytes(8, clock) == 1002 and reads == [7, 8]
    now[0] += readings.PSS_CACHE_SECONDS
    assert readings.pss_bytes(7, clock) == 1003                # read again once the window is over
    assert set(readings._pss_cache) == {7}                      # and pid 8, not asked again, forgotten


def test_pss_of_this_process_and_of_no_process():
    assert readings.pss_bytes(os.getpid()) > 1 << 20
    assert readings.pss_bytes(2 ** 22 + 12345) is None          # above pid_max: no such process
