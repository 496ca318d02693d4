"""How a training job's failures are found and handled, in one section (Megatron's resilience_config is the model):
the heartbeat and the hang threshold (launch.heartbeat), how soon a dead rank's job ends, the restart policy
(resilience.verdict, resilience.ledger: its budget, the hosts it may leave out, stragglers, a job left pending) and the
loss guard's rollbacks (train.guard). In no config hash (no stage's hash reads it, config.stages): changing one keeps
the checkpoint series and reruns nothing.

    python -c "from trainflow.config import compose; print(compose('train_segment', []).resilience)"
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainflow.config.domain import checked


@dataclass
class ResilienceConfig:
    heartbeat_s: float = checked(5.0, gt=0)
    """How often every rank beats, and the watchers look."""
    hang_detect_s: float = checked(0.0, ge=0)
    """A rank silent (or without step progress) this long is hung and ends the job (launch.heartbeat); 0: the larger
    of 60 s, 10 x the median step and BEATS heartbeats. At least BEATS x heartbeat_s where set: one late beat (a loaded
    node) is no hang, and the stacks watchdog must not fire between healthy beats (launch.hang.StacksWatchdog)."""
    start_s: float = checked(1800.0, gt=0)
    """A rank that has not finished its first step this long after its heartbeat started is hung too, wherever it
    stands (a load, a compile, a data read or a loop that never ends outside any collective): the allowance for a
    job's start-up, its checkpoint load and its first step's compilation (a 70B job's take minutes)."""
    failure_detect_s: float = checked(30.0, gt=0)
    """How soon a dead rank's job ends, as the goodput plan assumes it: srun's --kill-on-bad-exit (locally the
    launcher) ends the other ranks at once, and the stage sees the job's end within Slurm's poll and settle time
    (launch.job_end: about 20 s); the drills hold it."""
    max_restarts: int = checked(3, ge=0)
    """New jobs train_segment submits itself in a row without progress after a rank died or hung, each leaving out the
    failing host (and the gate's nccl-exclude.txt hosts); a job that saved a newer checkpoint than any before it
    resets the count, which the run's jobs ledger keeps across segments and reruns (resilience.ledger.standing), so a
    campaign's failures at its MTBF never use it up. Failures a restart cannot fix end the stage at once."""
    max_excluded_nodes: int = checked(32, ge=0)
    """The most hosts the run leaves out at once (the jobs ledger's blamed hosts not yet repaired, with the gate's):
    past it the stage stops in one line naming them, as a run that loses nodes faster than the site repairs them needs
    a person (seed: 1024 nodes; 32 is 3 %). A blamed host returns once Slurm shows it repaired
    (resilience.probation)."""
    health_check_after_s: float = checked(3600.0, ge=0)
    """A blamed host Slurm keeps in service is checked this long after its blame (and again this long after a check
    that failed): a job of its own on that node alone runs the gate's in-node collectives, a matmul against a CPU
    reference and the node's own evidence (launch.health_check), and returns it where all pass; 0: never checked,
    only Slurm's repair returns it. A check runs beside training and is read at the next job's start."""
    max_pending_s: float = checked(86400.0, ge=0)
    """A training or gate job still pending in Slurm's queue after this long (a requeued one too) is cancelled and the
    stage stops in one line with Slurm's reason (0: wait however long)."""
    exclude_stragglers: bool = False
    """A restart also leaves out the hosts whose ranks the last job flagged as stragglers (straggler_factor)."""
    straggler_factor: float = checked(1.5, gt=1)
    """A straggler: a rank whose median forward exceeds this many times the median over ranks (the report flags it;
    a restart leaves its host out under exclude_stragglers)."""
    recovery: str = checked("job", one_of=("job", "peers"))
    """How a job with spare nodes (cluster.allocation.spare_nodes) recovers a rank that died: job, every rank
    relaunched on the spare-patched nodes and the newest verified checkpoint re-read (launch.supervisor); peers, the
    surviving ranks keep their processes, rebuild their communicators at a new rendezvous and keep their state in
    memory, and the failed node's ranks start on a spare and take theirs from a live data-parallel replica, resuming
    at the failed step (launch.peers). A failure peers cannot recover (a hang, no live replica, no spare) goes the job
    way; the jobs ledger says which way each took."""
    max_rollbacks: int = checked(3, ge=0)
    """Rollbacks one job of a segment may make; the next ends it in one line (the loss diverges), naming each one's
    steps: a run that keeps diverging needs a lower learning rate or other data, not more rollbacks."""


MOVED = {
    "cluster.allocation.max_restarts": "resilience.max_restarts",
    "cluster.allocation.max_excluded_nodes": "resilience.max_excluded_nodes",
    "cluster.allocation.max_pending_s": "resilience.max_pending_s",
    "cluster.allocation.exclude_stragglers": "resilience.exclude_stragglers",
    "cluster.runtime.heartbeat_s": "resilience.heartbeat_s",
    "cluster.runtime.hang_detect_s": "resilience.hang_detect_s",
    "cluster.runtime.failure_detect_s": "resilience.failure_detect_s",
    "train.spike.max_rollbacks": "resilience.max_rollbacks",
    "train.straggler_factor": "resilience.straggler_factor",
}
"""The keys this section took over, by their former names: config.keys refuses one in a line naming its new name."""

MIN_HANG_S = 60.0
"""The shortest hang threshold resilience.hang_detect_s=0 gives: a slow step is not a hang."""
BEATS = 3
"""Heartbeats a hang threshold spans at least: a watcher sees a beat up to one period late, and a loaded node delays
one more."""


def hang_threshold_s(resilience: ResilienceConfig, median_step_s: float) -> float:
    """How long a rank may make no step progress before it counts as hung: resilience.hang_detect_s, or where that is
    0, the larger of MIN_HANG_S, 10 x the median step and BEATS heartbeats."""
    return resilience.hang_detect_s or max(MIN_HANG_S, 10 * median_step_s, BEATS * resilience.heartbeat_s)


def resilience_errors(r: ResilienceConfig) -> list[str]:
    """A hang threshold that spans BEATS heartbeats."""
    if 0 < r.hang_detect_s < BEATS * r.heartbeat_s and not math.isclose(r.hang_detect_s, BEATS * r.heartbeat_s):
        return [
            f"resilience.hang_detect_s({r.hang_detect_s:g}) < {BEATS} x resilience.heartbeat_s({r.heartbeat_s:g}): a "
            f"rank is hung once it misses beats, and one late beat is none; raise resilience.hang_detect_s to "
            f"{BEATS * r.heartbeat_s:g} or lower resilience.heartbeat_s to {at_most(r.hang_detect_s / BEATS)}"
        ]
    return []


def at_most(value: float) -> str:
    """`value` in three significant digits, rounded down (a fix that rounded up would be refused in turn)."""
    unit = 10.0 ** (math.floor(math.log10(value)) - 2)
    return f"{math.floor(value / unit) * unit:.3g}"
