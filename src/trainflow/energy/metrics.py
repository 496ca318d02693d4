"""A job's metrics file (metrics/<stage>.json, metrics/<stage>/<job>.json, a segment's metrics-<i>.json): what one
job of a stage measured of itself, written by trainflow.stage.run_stage, read by account_energy and report. A stage's
run() returns its StageFigures; the metrics are those and what run_stage measured around it.

    python -c "from trainflow.records import read_record; from trainflow.energy.metrics import JobMetrics; \
        print(read_record(JobMetrics, 'runs/default/metrics/prepare_data.json').wall_s)"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trainflow.energy.node import NodeReading, NodeSum
from trainflow.records import Record


@dataclass(frozen=True)
class StageFigures(Record):
    """What a stage's run() reports of its job: the figures of its work, and a distributed stage's ranks."""

    figures: dict[str, int | float | str] = field(default_factory=dict)
    """What the stage reported of its work (tokens, shards, bytes...), by name."""
    ranks: int = 1
    rank_cpu_s: float = 0.0
    """A distributed stage's ranks' CPU time, every rank's."""
    nodes: NodeSum | None = None
    """A training segment's nodes' counters, each node once."""
    node_windows: list[NodeReading] = field(default_factory=list)
    tokens: int = 0
    """Tokens a training segment trained on."""
    slurm_job_id: str | None = None
    """The Slurm job of a distributed stage's ranks; None: the stage process's own (run_stage reads it)."""


@dataclass(frozen=True, kw_only=True)
class JobMetrics(StageFigures):
    """The job's StageFigures, and what run_stage measured of it."""

    stage: str
    segment: int
    job: str
    """Which of the stage's jobs: prepare_data's tokenizer or shard-NNNNN, else the stage's name."""
    wall_s: float
    cpu_s: float
    """The stage process's own CPU time (its ranks' is rank_cpu_s)."""
    rapl_j: float | None
    """RAPL over the job where readable, on the stage process's node."""
    gpu_j: float | None
    host: str
    config: dict[str, object]
    """The resolved config the job ran with."""

    @classmethod
    def of(cls, figures: StageFigures, **measured: object) -> JobMetrics:
        """The metrics of a job whose run() reported `figures`; `measured` gives the fields of JobMetrics' own."""
        return cls(**{f.name: getattr(figures, f.name) for f in dataclasses.fields(StageFigures)}, **measured)
