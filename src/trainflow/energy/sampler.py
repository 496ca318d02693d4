"""A node's power over time: a thread that reads the node's counters every `period_s` and appends one JSON line.

    sampler = PowerSampler(path, gpus=gpus, period_s=1.0); sampler.start(); ...; totals = sampler.stop()

Each line holds the wall time `t`, the sampler's start `since` (a requeued job's sampler appends a new
run), and the energy counted since that start: `gpu_j` (NVML, all of the node's GPUs, with `gpu_w` their
power now and `gpu_busy_pct` their utilisation), `rapl_j` (RAPL packages, wrap-around corrected between
samples), and `cpu_busy_s` (the node's busy CPU-seconds from /proc/stat, for the stated model where RAPL is
unreadable). A counter the node lacks is absent. Cumulative figures make any window's energy a difference
of two interpolated samples (phases.py), and power a difference over the period (the report's plot).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from trainflow.energy.meter import rapl_gain_j, read_rapl
from trainflow.energy.nvml import NodeGpus

PROC_STAT = Path("/proc/stat")


def node_busy_cpu_s() -> float | None:
    """Seconds the node's CPUs spent busy since boot (every field of /proc/stat's cpu line but idle and iowait)."""
    try:
        fields = [int(x) for x in PROC_STAT.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # guest time is inside user


class PowerSampler:
    def __init__(self, path: Path, *, gpus: NodeGpus | None, period_s: float) -> None:
        self.path, self.gpus, self.period_s = path, gpus, period_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="power-sampler", daemon=True)
        self.first: dict = {}
        self.rapl_prev: dict | None = None
        self.rapl_j = 0.0
        self.last: dict = {}
        self.samples = 0

    def read(self) -> dict:
        """The node's counters now, as energy since the first reading."""
        sample: dict = {"t": time.time(), "since": self.first.setdefault("t", time.time())}
        if self.gpus is not None and (gpu := self.gpus.energy_j()) is not None:
            self.first.setdefault("gpu_j", gpu)
            sample["gpu_j"] = sum(b - a for a, b in zip(self.first["gpu_j"], gpu))
            sample["gpu_w"] = self.gpus.power_w()
            sample["gpu_busy_pct"] = self.gpus.busy_pct()
        if (rapl := read_rapl()) is not None:
            if self.rapl_prev is not None:
                self.rapl_j += rapl_gain_j(self.rapl_prev, rapl)
            self.rapl_prev = rapl
            sample["rapl_j"] = self.rapl_j
        if (busy := node_busy_cpu_s()) is not None:
            self.first.setdefault("cpu_busy_s", busy)
            sample["cpu_busy_s"] = busy - self.first["cpu_busy_s"]
        return sample

    def record(self) -> None:
        self.last = self.read()
        self.samples += 1
        with open(self.path, "a") as f:
            f.write(json.dumps(self.last) + "\n")

    def loop(self) -> None:
        while not self.stopped.wait(self.period_s):
            self.record()

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.record()
        self.thread.start()

    def stop(self) -> dict:
        """Stop, take the last sample; the node's energy over the whole window (absent counters: None)."""
        self.stopped.set()
        self.thread.join()
        self.record()
        return {
            "samples": self.samples,
            "gpu_j": self.last.get("gpu_j"),
            "rapl_j": self.last.get("rapl_j"),
            "cpu_busy_s": self.last.get("cpu_busy_s"),
        }
