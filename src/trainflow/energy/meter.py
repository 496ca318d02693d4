"""Energy counters a machine exposes: RAPL (CPU packages), NVML (GPU), and process CPU time.

Each reading says where it came from; `account_energy` turns missing counters into the stated
power x time model of `conf/energy/`. Nothing here guesses: an unreadable counter is None.
"""

from __future__ import annotations

import glob
import os
import resource
import time
from dataclasses import asdict, dataclass

RAPL_GLOB = "/sys/class/powercap/intel-rapl:*/energy_uj"


def read_rapl_j() -> float | None:
    """Sum of the CPU package energy counters in joules, or None where RAPL is absent or unreadable."""
    total, found = 0.0, False
    for path in glob.glob(RAPL_GLOB):
        if path.count(":") != 1:  # sub-domains (core, uncore) are already inside the package counter
            continue
        try:
            with open(path) as f:
                total += int(f.read()) / 1e6
            found = True
        except OSError:
            return None
    return total if found else None


def read_nvml_j() -> float | None:
    """Total energy of this node's GPUs in joules since driver load (NVML), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver / no library: a CPU machine
        return None
    try:
        n = pynvml.nvmlDeviceGetCount()
        return sum(
            pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(i)) / 1e3 for i in range(n)
        )
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Reading:
    wall_s: float
    cpu_s: float
    rapl_j: float | None
    gpu_j: float | None

    @classmethod
    def now(cls) -> Reading:
        return cls(time.time(), cpu_seconds(), read_rapl_j(), read_nvml_j())


def delta(start: Reading, end: Reading) -> dict:
    """What happened between two readings; counters missing at either end stay None."""
    out = {}
    for key, a in asdict(start).items():
        b = getattr(end, key)
        out[key] = None if a is None or b is None else b - a
    out["host"] = os.uname().nodename
    return out
