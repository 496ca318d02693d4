"""Whether a failed training job is worth a new one, and which hosts the new one leaves out.

    history = standing(jobs)                                          # the run's jobs ledger, at a segment's start
    verdict = judge(failure, earlier, max_restarts=3, restarts=history.without_progress)   # after each failed job

A rank that died (a signal, the OOM killer, a lost node) or hung (launch.heartbeat) is the machine's fault: a new job
on other hosts resumes from the newest verified checkpoint, the failing rank's host left out. So is a rank that raised
a device or interconnect error (NODE_FAULT: CUDA and driver errors, ECC, Xid, NCCL's errors), judged by its exception,
however many ranks and jobs raise one: a device error leaves its rank's host out, an NCCL error alone (every rank of
a broken ring raises one) blames no host. What a restart cannot fix ends the stage at once, in one line saying why:
- one of trainflow's own errors on any rank (TrainflowError: a config value, a data file, a checkpoint that fails
  verification with no older one to fall back to): the same input fails again;
- the same exception on every rank, or in two jobs: the code fails, wherever it runs;
- running out of device memory at the same step twice;
- a job Slurm or an operator ended (CANCELLED, DEADLINE; a TIMEOUT whose requeues ran out): a cancel stays a cancel;
- a job whose time limit came more often than cluster.allocation.max_requeues allows (submitit then raises instead
  of requeueing, and Slurm records FAILED): the requeues are the segment's budget of allocations, not a host's fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainflow.resilience.ledger import JobOutcome, checked_hosts


@dataclass(frozen=True, kw_only=True)
class JobFailure:
    line: str
    """The one line naming the cause, the job and a log file."""
    kind: JobOutcome
    """HANG, STOPPED, DIED, RAISED or LOST (never COMPLETED): what the jobs ledger records as the job's outcome."""
    state: str = ""
    """Slurm's final state ("" for a local job)."""
    rank: int | None = None
    host: str = ""
    step: int | None = None
    """The step the failing rank was at, where known."""
    errors: dict[int, str] = field(default_factory=dict)
    """Each rank that raised: its exception line."""
    expected: bool = False
    """A rank raised one of trainflow's own errors (TrainflowError): the cause is the input, not the machine."""
    world: int = 0
    """The job's ranks."""


NOT_RESTARTED_STATES = frozenset({"CANCELLED", "DEADLINE", "TIMEOUT"})


REQUEUES_USED_UP = re.compile(r"UncompletedJobError: .*timed-out too many times")
"""submitit's error where the pre-timeout signal came once more than cluster.allocation.max_requeues allows."""


HOST_FAULTS = frozenset({JobOutcome.HANG, JobOutcome.DIED, JobOutcome.RAISED})
"""The failures whose rank's host a restart leaves out."""


OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE)


DEVICE_FAULT = re.compile(
    r"CUDA error|CUDA driver error|cudaError|CUBLAS_STATUS_(?!SUCCESS)|CUDNN_STATUS_|\bECC\b|uncorrectable|\bXid\b|"
    r"NVML_ERROR|GPU is lost|fell off the bus",
    re.IGNORECASE,
)
"""An exception of the device or its driver (GPU and HBM faults were 52 % of Llama 3's 419 interruptions)."""


NETWORK_FAULT = re.compile(r"NCCL error|nccl\w*Error|ncclRemoteError|NCCL communicator was aborted", re.IGNORECASE)
"""An exception of the collectives' transport: the faulty peer is rarely the rank that raises."""


@dataclass(frozen=True)
class Verdict:
    restart: bool
    why: str
    """Why (not): one clause, for the log and the failure line."""
    exclude: frozenset[str] = frozenset()
    """The hosts the failure blames: every later job of the run leaves them out (JobRun.left_out)."""


def judge(
    failure: JobFailure,
    earlier: list[JobFailure],
    *,
    max_restarts: int,
    restarts: int,
    slow: frozenset[str] = frozenset(),
) -> Verdict:
    """Restart after `failure` (the failures before it in this segment: `earlier`), or not, and why; a restart leaves
    out the failing rank's host and the stragglers' hosts `slow` (resilience.exclude_stragglers)."""
    if failure.expected:
        return Verdict(False, "not restarted: trainflow refused an input, which a new job would refuse again")
    code = not node_fault(failure)  # a device or interconnect error may strike every rank, and job after job
    if code and len(failure.errors) == failure.world and len(set(failure.errors.values())) == 1:
        return Verdict(False, "not restarted: every rank raised the same exception, so the code fails wherever it runs")
    raised = set(failure.errors.values())
    if code and failure.kind == JobOutcome.RAISED and any(raised & set(f.errors.values()) for f in earlier):
        return Verdict(False, "not restarted: a rank raised the same exception in two jobs, so the code fails")
    if failure.state in NOT_RESTARTED_STATES:
        return Verdict(False, f"not restarted: Slurm ended the job ({failure.state}), which a new job would not undo")
    if any(REQUEUES_USED_UP.search(text) for text in failure.errors.values()):
        return Verdict(
            False,
            "not restarted: the job met its time limit more often than cluster.allocation.max_requeues allows "
            "(raise it, or cluster.allocation.time_min)",
        )
    oom = any(OUT_OF_MEMORY.search(text) for text in failure.errors.values())
    if oom and failure.step is not None and any(_oom_at(f, failure.step) for f in earlier):
        return Verdict(False, f"not restarted: out of memory at step {failure.step} twice (python -m trainflow.plan)")
    return restart(failure, max_restarts=max_restarts, restarts=restarts, slow=slow)


def restart(failure: JobFailure, *, max_restarts: int, restarts: int, slow: frozenset[str]) -> Verdict:
    """A machine's fault: a new job without the blamed hosts, unless the budget is used up (the hosts stay blamed:
    a rerun leaves them out)."""
    exclude = blamed_hosts(failure) | slow
    if restarts >= max_restarts:
        return Verdict(
            False,
            f"not restarted: resilience.max_restarts({max_restarts}) used up (that many restarts in a row "
            "saved no newer checkpoint)",
            exclude,
        )
    left_out = f", leaving out {', '.join(sorted(exclude))}" if exclude else ""
    return Verdict(True, f"restart {restarts + 1} of {max_restarts}{left_out}", exclude)


def node_fault(failure: JobFailure) -> bool:
    """A rank raised a device or interconnect error."""
    return any(DEVICE_FAULT.search(text) or NETWORK_FAULT.search(text) for text in failure.errors.values())


def blamed_hosts(failure: JobFailure) -> frozenset[str]:
    """The hosts a failure blames: the failing rank's, for a death, a hang with a culprit, or a raise (where the
    raise is an interconnect error, only if it is a device error too: the faulty peer is rarely the raiser)."""
    own = failure.errors.get(failure.rank, "") if failure.rank is not None else ""
    network_only = bool(NETWORK_FAULT.search(own)) and not DEVICE_FAULT.search(own)
    failed = {failure.host} if failure.kind in HOST_FAULTS and failure.host and not network_only else set()
    return checked_hosts(failed, "the failed job's task marker or hang report")


def _oom_at(failure: JobFailure, step: int) -> bool:
    return failure.step == step and any(OUT_OF_MEMORY.search(text) for text in failure.errors.values())
