"""nccl.json, validate_nccl's report: the typed record the stage writes and report (and training's restarts) read.

    python -c "from trainflow.records import read_record; from trainflow.gate.report import NcclReport; \
        print(read_record(NcclReport, 'runs/default/nccl.json').passed)"
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.plan.build import Plan
from trainflow.records import Record


@dataclass(frozen=True)
class SweepRow(Record):
    """The all_reduce sweep over the whole world at one message size (nccl-tests' all_reduce_perf)."""

    bytes: int
    time_s: float
    """The median over cluster.gate.sweep_iters, after a warm-up."""
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class PatternRow(Record):
    """One collective of the layout, timed on every group of its mesh dimension at once, judged on the slowest."""

    pattern: str
    groups: int
    group_size: int
    bytes: int
    slowest_group: list[int]
    """Its global ranks."""
    slowest_hosts: list[str]
    time_s: float
    busbw_gbps: float
    threshold_gbps: float | None
    """cluster.gate.busbw_gbps[pattern]; None: reported, not gated."""
    passed: bool | None


@dataclass(frozen=True)
class NodeFacts(Record):
    """One node's settings the seed's checklist names; None where this node cannot read them."""

    thp: str | None
    """Transparent huge pages' mode (the seed: never)."""
    swap_used_kb: int | None
    mps_daemon: bool
    gpu_slowdowns: list[int] | None
    """Each GPU's active clock slowdown reasons (NVML bits, 0: none)."""
    gpu_why: str
    """Why there are no GPU facts ('' where there are)."""

    @property
    def no_swapping(self) -> bool | None:
        return None if self.swap_used_kb is None else self.swap_used_kb == 0


@dataclass(frozen=True)
class HostFacts(Record):
    """What one rank saw of its node (every rank reports; hosts repeat once per rank on them)."""

    host: str
    node: NodeFacts
    versions: dict[str, str | None]
    """The software stack as the rank's environment sees it: image, uenv, torch, cuda, nccl, libfabric, aws_ofi_nccl
    (trainflow.stack; config.cluster's VERSION_COMPONENTS)."""


@dataclass(frozen=True)
class Stripes(Record):
    folder: str
    count: int | None
    """`lfs getstripe -c` of the checkpoint folder (-1: every target); None where it cannot be read."""
    source: str


@dataclass(frozen=True)
class Constant(Record):
    """One cluster.hardware value of the recorded plan: as configured, as measured, and how."""

    name: str
    configured: float
    measured: float
    source: str

    @property
    def ratio(self) -> float:
        return self.measured / self.configured


@dataclass(frozen=True)
class Calibration(Record):
    constants: list[Constant]
    """The values the gate measured; every other cluster.hardware value is the configured one."""
    configured_step_s: float
    """The step the configured constants plan (the recorded plan's step is the calibrated one)."""


@dataclass(frozen=True)
class NcclReport(Record):
    world_size: int
    backend: str
    sweep: list[SweepRow]
    """Empty at world size 1: nothing to measure."""
    patterns: list[PatternRow]
    hosts: list[HostFacts]
    """One per rank, in rank order."""
    checkpoint_stripes: Stripes
    env_warnings: list[str]
    threshold_gbps: float
    """cluster.gate.min_busbw_gbps, the sweep's gate at its largest message."""
    plan: Plan
    """The plan of the run (trainflow.plan) on the constants the gate measured (calibration); the plan validate_nccl
    made before any allocation, on the configured ones, only had to fit. The report is written only when the gate
    passed: a failure stops the DAG with its reasons instead."""
    calibration: Calibration | None = None
    """What the gate measured for the plan, beside the configured values (gate.calibrate); None in older files."""
