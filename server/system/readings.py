"""What the machine says about itself: memory, load, disk, temperature.

Readings come from /proc and /sys. Temperature sensors are slow to read, so the
hottest reading is cached for a couple of seconds: a health probe hammered at
thousands of requests per second must not turn into thousands of sysfs reads.
"""
from __future__ import annotations

import glob
import os
import shutil
import time

GIB = 1024 ** 3
SENSOR_CACHE_SECONDS = 2.0


def meminfo() -> dict[str, int]:
    """MemTotal and MemAvailable in bytes."""
    out = {}
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            name, _, rest = line.partition(b":")
            if name in (b"MemTotal", b"MemAvailable"):
                out[name.decode()] = int(rest.split()[0]) * 1024
    return out


def ram_gb(total_bytes: int) -> int:
    return max(1, round(total_bytes / GIB))


def system_uptime() -> float:
    with open("/proc/uptime", "rb") as f:
        return float(f.read().split()[0])


def disk_free(path: str) -> int:
    return shutil.disk_usage(path).free


def _sensor_files(sys_root: str) -> list[str]:
    return (glob.glob(f"{sys_root}/class/thermal/thermal_zone*/temp")
            + glob.glob(f"{sys_root}/class/hwmon/hwmon*/temp*_input"))


def read_hottest(sys_root: str = "/sys") -> float | None:
    """The hottest thermal zone or hwmon sensor in degrees Celsius; None with no sensors."""
    hottest = None
    for path in _sensor_files(sys_root):
        try:
            with open(path, "rb") as f:
                millidegrees = int(f.read().strip())
        except (OSError, ValueError):
            continue             # sensors that are asleep or absent answer with errors
        celsius = millidegrees / 1000.0
        if -60.0 < celsius < 200.0 and (hottest is None or celsius > hottest):
            hottest = celsius
    return hottest


class Thermometer:
    def __init__(self, read=read_hottest, clock=time.monotonic):
        self._read = read
        self._clock = clock
        self._value: float | None = None
        self._at = -1e9

    def celsius(self) -> float | None:
        now = self._clock()
        if now - self._at > SENSOR_CACHE_SECONDS:
            self._value = self._read()
            self._at = now
        return self._value


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of a process: its private pages plus its share of shared ones, so
    the PSS of a daemon and its workers add up without counting shared libraries twice."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
