"""Energy counters a machine exposes: RAPL (CPU packages), NVML (GPU), and process CPU time.

    Reading.now()   # a stage's own window (stage.py); training's per-node windows are node.py's

Each reading says where it came from; `account_energy` turns missing counters into the stated
power x time model of `conf/energy/`. Nothing here guesses: an unreadable counter is None.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from trainflow.energy.nvml import NodeGpus

RAPL_ROOT = Path("/sys/class/powercap")


def read_rapl() -> dict[str, tuple[float, float]] | None:
    """Each CPU package's energy counter and its wrap-around range, in joules; None where RAPL is absent or
    unreadable (many kernels make energy_uj readable by root only)."""
    packages = {}
    for folder in sorted(RAPL_ROOT.glob("intel-rapl:*")):
        if folder.name.count(":") != 1:  # sub-domains (core, uncore, dram) are inside the package counter
            continue
        try:
            energy = int((folder / "energy_uj").read_text()) / 1e6
            wrap = int((folder / "max_energy_range_uj").read_text()) / 1e6
        except (OSError, ValueError):
            return None
        packages[folder.name] = (energy, wrap)
    return packages or None


def rapl_gain_j(start: dict[str, tuple[float, float]], end: dict[str, tuple[float, float]]) -> float:
    """Joules between two RAPL readings, across at most one wrap of each package's counter."""
    return sum((end[k][0] - e) % wrap for k, (e, wrap) in start.items())


def read_nvml_j() -> float | None:
    """Total energy of this node's GPUs in joules since driver load (NVML), or None without NVML."""
    gpus, _ = NodeGpus.open()
    if gpus is None:
        return None
    try:
        energy = gpus.energy_j()
        return sum(energy) if energy is not None else None
    finally:
        gpus.close()


def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Reading:
    wall_s: float
    cpu_s: float
    rapl: dict[str, tuple[float, float]] | None
    gpu_j: float | None

    @classmethod
    def now(cls) -> Reading:
        return cls(time.time(), cpu_seconds(), read_rapl(), read_nvml_j())


def delta(start: Reading, end: Reading) -> dict:
    """What happened between two readings; counters missing at either end stay None."""
    both = start.rapl is not None and end.rapl is not None
    return {
        "wall_s": end.wall_s - start.wall_s,
        "cpu_s": end.cpu_s - start.cpu_s,
        "rapl_j": rapl_gain_j(start.rapl, end.rapl) if both else None,
        "gpu_j": None if start.gpu_j is None or end.gpu_j is None else end.gpu_j - start.gpu_j,
        "host": os.uname().nodename,
    }
