"""What the machine says about itself: memory, load, disk, temperature.

Readings come from /proc and /sys. Temperature sensors are slow to read, so the
hottest reading is cached for a couple of seconds: a health probe hammered at
thousands of requests per second must not turn into thousands of sysfs reads.
A process's PSS is cached too: the kernel walks every page table of the process
to answer smaps_rollup (2-5 ms for a worker holding SmolLM2, measured), and a
cluster's heartbeats ask for it every second on the event loop, on the core that
decodes.
"""
from __future__ import annotations

import glob
import os
import shutil
import time

GIB = 1024 ** 3
SENSOR_CACHE_SECONDS = 2.0
PSS_CACHE_SECONDS = 2.0          # a process's PSS is read at most this often (heartbeats: each 1 s)


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


_pss_cache: dict[int, tuple[float, int | None]] = {}


def pss_bytes(pid: int, clock=time.monotonic) -> int | None:
    """Proportional set size of a process: its private pages plus its share of shared ones, so
    the PSS of a daemon and its workers add up without counting shared libraries twice. At most
    PSS_CACHE_SECONDS old."""
    now = clock()
    cached = _pss_cache.get(pid)
    if cached is not None and now - cached[0] < PSS_CACHE_SECONDS:
        return cached[1]
    for old in [p for p, (at, _) in _pss_cache.items() if now - at >= PSS_CACHE_SECONDS]:
        del _pss_cache[old]      # pids come and go: keep only the fresh ones
    value = _read_pss(pid)
    _pss_cache[pid] = (now, value)
    return value


def _read_pss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
