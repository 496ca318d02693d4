"""A job's start-up in parts (cluster.hardware.startup): what each rank records as it starts (launch.task's marker,
the jobs ledger's JobRun.parts) and what the goodput plan models at the campaign's world size (trainflow.plan.startup).

    python -m trainflow.plan experiment=llama70b_alps     # "Start-up": each part at the campaign's world size
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from trainflow.config.domain import checked


class StartupPart(StrEnum):
    """The parts of a start-up in the order they end, each named for what has ended: a rank's task marker records
    the wall-clock time of each (launch.task), the ledger their seconds (JobRun.parts)."""

    VERDICT = "verdict"
    """A hot restart's only: from the failure the supervisor saw to the new job step asked for (its judgement)."""
    LAUNCH = "launch"
    """From the job or job step asked for to the rank's process started (srun, the container, the interpreter)."""
    IMPORTS = "imports"
    """From the process's start to the task's code running: Python, torch and trainflow imported, the task unpickled."""
    RENDEZVOUS = "rendezvous"
    """init_process_group: every rank meets at rank 0's TCPStore."""
    COMMUNICATORS = "communicators"
    """The device mesh's process groups made (parallel.mesh.build_mesh)."""
    BUILD = "build"
    """The model, optimizers, sampler and checkpoint manager built (train.trainer.Trainer)."""
    LOAD = "load"
    """The newest checkpoint found and loaded (DCP's plan on its coordinator, the reads, the exchange)."""
    FIRST_STEP = "first_step"
    """The first trained step's end (TaskMarker.first_step)."""


RANK_PARTS = tuple(StartupPart)[1:]
"""The parts a rank records (the verdict is the supervisor's: the ledger's record of the step before and this one)."""


@dataclass
class PartLaw:
    """One part's seconds as a law in the world size W: seconds + per_rank_s x W + per_doubling_s x log2(W)."""

    seconds: float = checked(0.0, ge=0)
    """The constant, fitted to the drills (StartupConfig.fitted)."""
    per_rank_s: float = checked(0.0, ge=0)
    """What each rank adds: a cost one server pays per rank (rank 0's TCPStore, DCP's coordinator)."""
    per_doubling_s: float = checked(0.0, ge=0)
    """What each doubling of the world adds: a tree's depth (NCCL's communicator set-up)."""


@dataclass
class StartupConfig:
    """The start-up's model (trainflow.plan.startup): each part's law, the first step's adding one step of the plan.
    cluster.hardware.startup_s and hot_restart_s, where set, override its sums."""

    fitted: str = checked("", pattern=r"[ -~]{1,200}", fix="one line saying which drills the constants were fitted to")
    """Where the constants were measured (the drills, their ranks and count): what the plan prints beside them."""
    verdict: PartLaw = field(default_factory=PartLaw)
    launch: PartLaw = field(default_factory=PartLaw)
    imports: PartLaw = field(default_factory=PartLaw)
    rendezvous: PartLaw = field(default_factory=PartLaw)
    communicators: PartLaw = field(default_factory=PartLaw)
    build: PartLaw = field(default_factory=PartLaw)
    load: PartLaw = field(default_factory=PartLaw)
    """The load's own cost beside its bytes, which the plan adds as its load (plan.scenarios.load_times)."""
    first_step: PartLaw = field(default_factory=PartLaw)
    """What the first step takes beyond one step of the plan (warm-up, lazily made communicators)."""

    def law(self, part: StartupPart) -> PartLaw:
        return getattr(self, part.value)
