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

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from submitit.core.utils import JobPaths

from trainflow.errors import TrainflowError
from trainflow.launch.failure import JobFailure
from trainflow.launch.heartbeat import timing_path
from trainflow.records import RecordError
from trainflow.train.goodput import JobOutcome, JobRun
from trainflow.train.summary import RankTiming, stragglers

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
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""A node name as sbatch --exclude takes it. Hosts come from files of the run folder (task markers, the hang report,
nccl-exclude.txt), which may be hostile: nothing else reaches the sbatch script."""


class HostError(TrainflowError):
    """A host name to leave out that is not one."""


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
    out the failing rank's host and the stragglers' hosts `slow` (cluster.allocation.exclude_stragglers)."""
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
            f"not restarted: cluster.allocation.max_restarts({max_restarts}) used up (that many restarts in a row "
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


@dataclass(frozen=True)
class Standing:
    """Where the run stands, from its jobs ledger (every job of every segment and rerun, train.goodput.JobRun)."""

    excluded: dict[str, str]
    """Each host the run leaves out -> the job whose failure blamed it."""
    without_progress: int
    """The restarts in a row since a job last saved a newer checkpoint than any before it (or completed)."""


def standing(jobs: list[JobRun]) -> Standing:
    """The run's excluded hosts and restarts without progress, from its jobs ledger in order."""
    excluded: dict[str, str] = {}
    newest, used = -1, 0
    for job in jobs:
        for host in checked_hosts(job.left_out, f"the jobs ledger's job {job.job_id}"):
            excluded.setdefault(host, f"job {job.job_id}")
        if job.outcome == JobOutcome.COMPLETED:
            used = 0
        else:
            used = 0 if job.checkpoint > newest else used  # it trained a checkpoint interval: a fresh count
            used += 1
        newest = max(newest, job.checkpoint)
    return Standing(excluded, max(used - 1, 0) if jobs and jobs[-1].outcome != JobOutcome.COMPLETED else 0)


def over_cap(excluded: frozenset[str], cap: int, ledger: Path) -> str | None:
    """Why the run stops before its next job, where it leaves out more hosts than cluster.allocation allows."""
    if len(excluded) <= cap:
        return None
    return (
        f"the run leaves out {len(excluded)} hosts ({', '.join(sorted(excluded))}), past "
        f"cluster.allocation.max_excluded_nodes ({cap}): repair them and raise the cap, or start the run's ledger "
        f"{ledger} afresh once they are back"
    )


def _oom_at(failure: JobFailure, step: int) -> bool:
    return failure.step == step and any(OUT_OF_MEMORY.search(text) for text in failure.errors.values())


def checked_hosts(hosts: list[str] | set[str] | frozenset[str], where: str) -> frozenset[str]:
    """`hosts`, each a node name (HOST); else one HostError naming the value and its file."""
    for host in hosts:
        if not isinstance(host, str) or not HOST.fullmatch(host):
            raise HostError(
                f"{where} names the host {host!r} to leave out, which is not a node name ([A-Za-z0-9._-], up to 63 "
                "characters); the file was altered: delete it"
            )
    return frozenset(hosts)


def gate_exclusions(path: str | Path) -> frozenset[str]:
    """The hosts validate_nccl's gate wrote to leave out (nccl-exclude.txt, comma-separated); none when absent."""
    path = Path(path)
    if not path.is_file():
        return frozenset()
    hosts = [h.strip() for h in path.read_text(errors="replace").replace("\n", ",").split(",") if h.strip()]
    return checked_hosts(hosts, str(path))


def straggler_hosts(paths: JobPaths, factor: float) -> frozenset[str]:
    """The hosts of the ranks a failed job's heartbeat last timed as stragglers (launch.heartbeat's timing file);
    none when it wrote none (a job shorter than a minute) or one that does not read."""
    path = timing_path(paths)
    timings: list[RankTiming] = []
    with contextlib.suppress(OSError, ValueError, TypeError, RecordError):
        timings = [RankTiming.from_json(t, where=str(path)) for t in json.loads(path.read_text())]
    return checked_hosts({t.host for t in stragglers(timings, factor)}, str(path))
