"""energy.json, account_energy's report: the typed record the stage writes and report reads.

    python -c "from trainflow.records import read_record; from trainflow.energy.report import EnergyReport; \
        print(read_record(EnergyReport, 'runs/default/energy.json').total.it_j)"

Every figure keeps its source: `nvml` and `rapl` are counters, `slurm` is Slurm's accounting, `model: ...` a stated
power x time estimate (conf/energy/).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.records import Record


@dataclass(frozen=True)
class StageEnergy(Record):
    """IT energy of one job of a stage, by part, with the source of each."""

    stage: str
    segment: int
    job: str
    wall_s: float
    cpu_s: float
    cpu_j: float
    cpu_source: str
    gpu_j: float
    gpu_source: str
    it_j: float

    @property
    def label(self) -> str:
        """train_segment[1], prepare_data/shard-00003 (one of a stage's jobs), or the stage."""
        if self.stage == "train_segment":
            return f"train_segment[{self.segment}]"
        return f"{self.stage}/{self.job}" if self.job and self.job != self.stage else self.stage


@dataclass(frozen=True)
class PhaseEnergy(Record):
    """A training segment's energy in one phase: data, compute, checkpoint, or other (start-up, evaluation)."""

    phase: str
    seconds: float
    gpu_j: float
    cpu_j: float
    it_j: float
    gpu_source: str
    cpu_source: str


@dataclass(frozen=True)
class SegmentEnergy(Record):
    segment: int
    it_j: float
    nodes: int
    power_traces: list[str]
    """Each node's power samples over time (the report's power plot)."""
    phases: list[PhaseEnergy]


@dataclass(frozen=True)
class Facility(Record):
    it_j: float
    facility_j: float
    """IT energy x energy.pue."""
    facility_kwh: float
    co2_g: float
    """At energy.grid_gco2_per_kwh."""


@dataclass(frozen=True)
class TrainingEnergy(Record):
    it_j: float
    facility_j: float
    tokens: int
    tokens_per_it_joule: float | None
    tokens_per_facility_joule: float | None
    device_hours: float
    device: str
    """GPU, or CPU rank where the ranks drove no GPU."""


@dataclass(frozen=True)
class DvfsOutcome(Record):
    """The DVFS policy replayed on the segments' recorded phases (energy.dvfs)."""

    enabled: bool
    applied: bool
    """Whether the driver took the clocks (NVML); the saving is an estimate either way."""
    data_loading_s: float
    lowered_s: float
    lowered_phases: int
    idle_clock_mhz: int
    compute_clock_mhz: int
    gpus: int
    estimated_saving_j: float
    basis: str
    """What the estimate assumed."""


@dataclass(frozen=True)
class SlurmComparison(Record):
    """Slurm's ConsumedEnergy of a job beside the meter's IT figure."""

    stage: str
    segment: int
    job_id: str | None
    status: str
    consumed_j: float | None
    meter_j: float
    difference_j: float | None


@dataclass(frozen=True)
class EnergyReport(Record):
    stages: list[StageEnergy]
    segments: list[SegmentEnergy]
    total: Facility
    training: TrainingEnergy
    pue: float
    grid_gco2_per_kwh: float
    actions: list[str]
    """Power cap and DVFS: what each node set, or why not."""
    dvfs: DvfsOutcome
    slurm: list[SlurmComparison]
