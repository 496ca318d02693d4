"""A training segment's summary: the typed record train_segment writes (train/<series>/segment-<i>.json) and
account_energy and report read. Nothing here imports torch: the stages that only read it start without it.

    python -c "from trainflow.records import read_record; from trainflow.train.summary import SegmentSummary; \
        print(read_record(SegmentSummary, 'runs/default/train/<series>/segment-0.json').speed.median_step_s)"

Its fields group into what the segment ran with (SegmentSetup), how fast (SegmentSpeed), the records of its steps,
evaluations and saves, which the trainer assembles, and what the stage adds once from every rank's RankResult (the
Slurm job, the nodes' software stacks) and its jobs (goodput). A rank's task hands the stage a RankResult: the
trainer's summary beside what the task measured around it (its energy, its stack, its Slurm job), so each field has
one place that sets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.campaign.records import Lineage
from trainflow.checkpoint.interval import IntervalPlan
from trainflow.config.layout import ParallelDims
from trainflow.data.mixture import SourceShare
from trainflow.energy.node import NodeReading
from trainflow.records import Record
from trainflow.resilience.goodput import Goodput
from trainflow.resilience.timing import RankTiming
from trainflow.stack import NodeStack
from trainflow.train.guard import GuardEvent, window_ranges
from trainflow.train.step_log import EvalRecord, StepRecord


@dataclass(frozen=True)
class Operator(Record):
    name: str
    self_ms: float
    share: float
    """Of all operators' self time over the profiled steps."""
    calls: int


@dataclass(frozen=True)
class ProfileSummary(Record):
    """The profiled steps of a segment on rank 0 (observe.profile; trainflow.train.profile writes it)."""

    trace: str
    clock: str
    """Whose self time: cpu, or device on a GPU."""
    top: list[Operator]


@dataclass(frozen=True)
class SaveRecord(Record):
    """One checkpoint save of this job, once durable (checkpoint.interval's SaveDone, rank 0's figures): the energy
    report's checkpoint phase and the report's checkpoint lines."""

    step: int
    started: float
    """Wall-clock time the save began."""
    save_s: float
    """Seconds training was blocked by it: the whole save in sync mode; in async mode the staging, an optimizer
    step's wait for the background copy and the step boundaries' agreements while it was in flight."""
    background_s: float | None = None
    """checkpoint.mode=async: the slowest rank's background copy and write plus rank 0's manifest and rename; None
    in sync mode."""
    waited_s: float = 0.0
    """Seconds the next save, a stop signal or the segment's end waited for it to become durable."""
    overlap_steps: int = 0
    """Steps that ran while it was in the background (steps `step` to `step + overlap_steps - 1`): the report
    compares their mean time with the other steps'."""


@dataclass(frozen=True)
class Fp8Use(Record):
    recipe: str
    """train.fp8: none, dynamic or delayed."""
    backend: str | None
    """Which fp8_gemm implementation ran (trainflow.fp8.load_backend); None without fp8."""
    reason: str | None = None
    """Why that one, in one line (trainflow.fp8.backend_reason: the measured fact that chose it)."""


@dataclass(frozen=True)
class RankEnergy(Record):
    """What one rank adds to its job's energy: its own CPU time, and its node's window on the node's local rank 0."""

    cpu_s: float
    node: NodeReading | None


@dataclass(frozen=True)
class SegmentSetup(Record):
    """What the segment ran with: the layout, the model's size and the training settings that shape its speed."""

    layout: ParallelDims
    parameters: int
    precision: str
    activations: str
    compile: bool
    fp8: Fp8Use
    flops_per_token: float
    checkpoint_interval: IntervalPlan
    init_from: str | None = None
    """The Hugging Face folder the run's step 0 was initialised from (io.init_from); None: random weights."""


@dataclass(frozen=True)
class SegmentSpeed(Record):
    median_step_s: float
    """The median of the segment's steps, its first (warm-up) left out; NaN: no step."""
    tokens_per_s_per_device: float
    mfu: float


def guard_ranges(data: dict) -> dict:
    """Format 1 -> 2: its guard events' windows as GuardEvent's own migration rewrites them (the steps' records only
    gained fields, the lineage is new)."""
    return {**data, "guard": [window_ranges(event) for event in data.get("guard", [])]}


@dataclass(frozen=True)
class SegmentSummary(Record):
    FORMAT = 2
    MIGRATIONS = {1: guard_ranges}

    segment: int
    start_step: int
    end_step: int
    """The step it stopped at: its end, or the agreed step of a stop signal."""
    completed: bool
    interrupted_by: str | None
    """SIGUSR2 (requeued) or SIGTERM (ended) when a signal stopped it; None when it ran to its end."""
    restart_count: int
    """Slurm's requeues of this job so far."""
    setup: SegmentSetup
    speed: SegmentSpeed
    state_digest: list[str]
    """Every rank's SHA-256 of its model and optimizer tensors: equal lists are bitwise equal runs."""
    profile: ProfileSummary | None
    saves: list[SaveRecord]
    steps: list[StepRecord]
    """Rank 0's step records of the whole segment (resumed parts included)."""
    evals: list[EvalRecord]
    guard: list[GuardEvent] = field(default_factory=list)
    """The loss-spike guard's skips and rollbacks in this segment (train.guard)."""
    ranks: list[RankTiming] = field(default_factory=list)
    """Every rank's own compute time (on rank 0's summary; the others gather none)."""
    goodput: Goodput | None = None
    """Set by the stage: where the segment's wall time went, over every job it took (resilience.goodput)."""
    slurm_job_id: str | None = None
    """Set by the stage: the job's, from its ranks' results."""
    mixture: list[SourceShare] = field(default_factory=list)
    """The realised mixture of the segment's applied steps: each source's tokens and share (data.mixture)."""
    stack: list[NodeStack] = field(default_factory=list)
    """Set by the stage: the software stack training ran on, every node's of the job's ranks (trainflow.stack)."""
    lineage: Lineage | None = None
    """Set by the stage: what the segment continued from, the settings and code its jobs changed (campaign.records);
    None before format 2."""


@dataclass(frozen=True)
class RankResult(Record):
    """What one rank's task hands the stage: the trainer's summary (without what the stage sets) and what the task
    measured around training."""

    summary: SegmentSummary
    energy: RankEnergy
    """This rank's share of the job's energy."""
    stack: NodeStack
    """The software stack as this rank sees it, inside the job's container if any (trainflow.stack)."""
    slurm_job_id: str | None
