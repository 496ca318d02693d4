"""The failure drills' settings (cfg.fault): which fault strikes, where and when; trainflow.train.faults injects it.

python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=STOP   # a hung rank
python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=STALL  # a stuck main thread
python -m trainflow.stages.train_segment fault.mtbf_s=60 fault.seed=3                 # failures at a rate
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.domain import checked


@dataclass
class FaultConfig:
    """Fault injection for tests and failure drills. Read by no stage's config hash, so a drill and its rerun without
    the fault share one checkpoint series. The signals strike in a segment's first job only: a job train_segment
    restarts after a failure meets no fault, as a transient failure would not come back."""

    step: int = checked(-1, ge=-1)
    """At the start of this step (-1: never) ..."""
    rank: int = checked(0, ge=0)
    """... this rank ..."""
    signal: str = checked("USR2", one_of=("USR2", "TERM", "KILL", "STOP", "STALL", "WEDGE", "CUDA"))
    """... receives this signal: USR2 (Slurm's pre-timeout: save and requeue), TERM (scancel or the time limit:
    save and stop, no requeue), KILL (a dead rank) or STOP (a hung one). Two hangs that are no signal: STALL, the
    rank's main thread blocks for good while its heartbeat thread beats on (a GPU stuck in a kernel, a wedged
    driver call that releases the GIL: the others wait for it in their next collective); WEDGE, every rank
    (whatever fault.rank says) blocks inside one collective that never completes (a failed link or switch: a
    symmetric hang, which no rank's evidence can pin on a host). CUDA raises a device error as torch words one (an
    illegal memory access, then an ECC error in the next job)."""
    strikes: int = checked(1, ge=1)
    """The signal strikes in the segment's first `strikes` jobs: in job k at fault.step + k x fault.stride (a failure
    that comes back after each restart)."""
    stride: int = checked(0, ge=0)
    during_save: bool = False
    """Instead: the rank dies inside the checkpoint write of this step, after the shards, before the rename."""
    slow_ms: float = checked(0.0, ge=0, le=60000)
    """fault.rank sleeps this long in every step's forward, in every job (a straggler: a throttled device); with a
    signal too, that rank is both slow and then killed or stopped."""
    nan_step: int = checked(-1, ge=-1)
    """The loss and gradients of the step that draws this data window (its first sample at global position nan_step x
    train.global_batch: that step, unless the guard skipped windows) come out NaN on every rank (-1: never): the
    loss-spike guard's drill. Unlike
    the signals, it strikes in every job of the segment, so a rerun meets it again."""
    mtbf_s: float = checked(0.0, ge=0, le=1e9)
    """Failures at a rate (0: none; else at least MIN_MTBF_S): a seeded Poisson process of this mean gap over the
    campaign's wall time, on its own clock from the campaign's start (the run's faults.jsonl), so every segment, job
    and restart continues one process. Each arrival kills a random rank (SIGKILL) or stalls it (STALL), stalls in the
    share cluster.hardware.hang_share. It strikes only while a job holds its ranks, as the planner's failures do: from a
    restart's start, and from a segment's first step in its first job (trainflow.resilience.arrivals)."""
    seed: int = checked(0, ge=0)
    """The arrival process's seed: the same seed, MTBF and start give the same failures."""


MIN_MTBF_S = 1.0
"""The shortest fault.mtbf_s: a job's start-up alone takes seconds, so a shorter gap fails every job before its first
step (and its arrivals, one window of fault.mtbf_s each, would come faster than a rank can look for them)."""


def fault_errors(f: FaultConfig) -> list[str]:
    if 0 < f.mtbf_s < MIN_MTBF_S:
        return [
            f"fault.mtbf_s({f.mtbf_s:g}) is no failure rate a job can meet (every job would fail before its first "
            f"step): give fault.mtbf_s={MIN_MTBF_S:g} or more, or fault.mtbf_s=0 for none"
        ]
    return []
