"""One energy window per node: the local rank 0 of each node meters, samples and controls that node's GPUs and
CPU packages; every other rank only reports its own CPU time. The stage then sums nodes, never ranks.

    with node_window(cfg.energy, local_rank=env.local_rank, folder=RunFolder.of(cfg).power, segment=0) as window:
        Trainer(cfg, device, on_phase=lambda kind, step: window.enter(kind)).train()   # train_segment: data, compute
    result = window.result()   # None on ranks that are not their node's local rank 0

NVML's energy counter is per GPU and RAPL's per CPU package, and both count everything on the node: read
by every rank and summed, a node with 4 ranks counted its GPUs 4 times. `sum_nodes` refuses two windows of
one host, so nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainflow.config import EnergyConfig
from trainflow.energy.control import GpuControls
from trainflow.energy.nvml import NodeGpus
from trainflow.energy.sampler import PowerSampler
from trainflow.errors import TrainflowError
from trainflow.host import hostname
from trainflow.records import Record

COUNTERS = ("gpu_j", "rapl_j", "cpu_busy_s")


@dataclass(frozen=True)
class NodeReading(Record):
    """What one node's window measured and did over a training job (its local rank 0's)."""

    host: str
    gpus: int
    wall_s: float
    gpu_j: float | None
    """NVML's energy counter over the window, all the node's GPUs (None: no NVML energy here)."""
    rapl_j: float | None
    cpu_busy_s: float | None
    samples: int
    trace: str
    """The node's power samples over time (JSON lines)."""
    why_no_nvml: str
    actions: list[str]
    """Power cap and DVFS: what was set, or why not."""
    dvfs_applied: bool
    dvfs_lowered_phases: int


class NodeWindow:
    def __init__(self, controls: GpuControls | None, sampler: PowerSampler | None, gpus: int) -> None:
        self.controls, self.sampler, self.gpus = controls, sampler, gpus
        self.started = time.time()
        self.totals: dict = {}

    def enter(self, kind: str) -> None:
        """The trainer's phase marker (data, compute): DVFS acts on it on the metering rank."""
        if self.controls is not None:
            self.controls.enter(kind)

    def result(self) -> NodeReading | None:
        if self.sampler is None or self.controls is None:
            return None
        return NodeReading(
            host=hostname(),
            gpus=self.gpus,
            wall_s=self.totals["ended"] - self.started,
            gpu_j=self.totals["gpu_j"],
            rapl_j=self.totals["rapl_j"],
            cpu_busy_s=self.totals["cpu_busy_s"],
            samples=self.totals["samples"],
            trace=str(self.sampler.path),
            why_no_nvml=self.controls.why_not,
            actions=self.controls.actions,
            dvfs_applied=self.controls.clocks_applied,
            dvfs_lowered_phases=self.controls.lowered,
        )


@contextlib.contextmanager
def node_window(energy: EnergyConfig, *, local_rank: int, folder: str, segment: int) -> Iterator[NodeWindow]:
    """Meter, sample and control this node's devices on its local rank 0 (elsewhere a window that does nothing);
    the GPUs' settings are restored on every way out of the block."""
    if local_rank != 0:
        yield NodeWindow(None, None, 0)
        return
    host = hostname()
    gpus, why_not = NodeGpus.open()
    controls = GpuControls(gpus, why_not, energy=energy, state_file=Path(folder) / f"gpu-state-{host}.json")
    trace = Path(folder) / f"segment-{segment}-{host}.jsonl"
    sampler = PowerSampler(trace, gpus=gpus, period_s=energy.sample_period_s)
    window = NodeWindow(controls, sampler, len(gpus.handles) if gpus else 0)
    try:
        controls.start()
        sampler.start()
        yield window
    finally:
        try:
            window.totals = {**sampler.stop(), "ended": time.time()} if sampler.samples else {}
            controls.restore()
        finally:
            if gpus is not None:
                gpus.close()


def actions_taken(windows: list[NodeReading]) -> list[str]:
    """Each node's power-cap and DVFS actions (or why not), each distinct line once."""
    return list(dict.fromkeys(a for w in windows for a in w.actions))


@dataclass(frozen=True)
class NodeSum(Record):
    """A job's nodes' windows summed, each host once; a counter missing on any node is None for the whole job."""

    nodes: int
    gpus: int
    gpu_j: float | None
    rapl_j: float | None
    cpu_busy_s: float | None


def sum_nodes(windows: list[NodeReading]) -> NodeSum:
    """Energy of the nodes' windows, each host once (NodeSum)."""
    hosts = [w.host for w in windows]
    if twice := sorted({h for h in hosts if hosts.count(h) > 1}):
        raise TrainflowError(
            f"hosts {twice} sent more than one energy window: only each node's local rank 0 may meter it"
        )

    def total(key: str) -> float | None:
        values = [getattr(w, key) for w in windows]
        return None if not values or None in values else sum(values)

    return NodeSum(len(windows), sum(w.gpus for w in windows), *(total(k) for k in COUNTERS))
