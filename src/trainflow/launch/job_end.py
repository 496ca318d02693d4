"""Waiting for a job, and its failure (launch.failure) when it ended without every task's result.

    python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=KILL   # a dead rank

The wait is bounded: submitit learns a Slurm job's end only from sacct and, without accounting, waits
forever for a job that ended without a result; here the state comes from scontrol (sacct once
slurmctld forgot it).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import submitit
from submitit.core.utils import pickle_load
from submitit.local.local import LocalJob

from trainflow.errors import TrainflowError
from trainflow.launch.failure import ENDED, NODE_FAULTS, analyse
from trainflow.resilience.verdict import JobFailure

log = logging.getLogger(__name__)

STATE_EVERY_S = {"local": 1.0, "slurm": 5.0}
"""Seconds between looks at a job's state while its result files are missing (looked at every second)."""
SETTLE_S = {"local": 0.0, "slurm": 15.0}
"""Seconds a job must stay ended before its missing results count as lost: a shared file system shows files
late, and a requeued Slurm job may pass a final-looking state before it is PENDING again. A local job's
controller exits after its tasks, on this machine's file system."""


class LaunchError(TrainflowError):
    """A distributed job that ended without every task's result; the message names the cause and a log file, and
    `failure` holds what the launcher learnt of it (launch.failure: which rank, how, whether a restart can help)."""

    def __init__(self, message: str, failure: JobFailure | None = None) -> None:
        super().__init__(message)
        self.failure = failure


def run_job(executor: submitit.Executor, fn: object, *, max_pending_s: float = 0.0) -> list:
    """Submit `fn`, wait, and return every task's result; a failure becomes one LaunchError line."""
    return wait_job(executor.submit(fn), max_pending_s=max_pending_s)


def wait_job(job: submitit.Job, *, max_pending_s: float = 0.0, owned: Callable[[], bool] = lambda: True) -> list:
    """Wait for a submitted job and return every task's result; a failure becomes one LaunchError line, and so does a
    Slurm job left pending for longer than `max_pending_s` (0: however long), which is cancelled. `owned`: whether
    this process still answers for the job (launch.live_job: a rerun may have re-attached), else an interrupt
    leaves it running."""
    kind = "local" if isinstance(job, LocalJob) else "slurm"
    log.info("Waiting for %s job %s (world size %d); logs in %s", kind, job.job_id, job.num_tasks, job.paths.folder)
    with cancel_on_interrupt(job, kind, owned):
        end = wait_for_end(job, kind, max_pending_s)
    return task_results(job, kind, end or ("", 0))


def task_results(job: submitit.Job, kind: str, end: tuple[str, int] = ("", 0)) -> list:
    """Every task's result from the job's folder, once it ended (`end`: its final Slurm state and requeue count); one
    LaunchError holding the failure (launch.failure.analyse) where one is missing or an error."""
    outcomes = [
        pickle_load(path) if (path := job.task(k).paths.result_pickle).exists() else None for k in range(job.num_tasks)
    ]
    if all(outcome and outcome[0] == "success" for outcome in outcomes):
        return [outcome[1] for outcome in outcomes]
    failure = analyse(job, kind, end, outcomes, lost_nodes(job.job_id) if end[0] in NODE_FAULTS else [])
    raise LaunchError(failure.line, failure)


def wait_for_end(job: submitit.Job, kind: str, max_pending_s: float = 0.0) -> tuple[str, int] | None:
    """Wait until every task's result file exists (None) or the job has ended without them: then its final
    Slurm state and requeue count (a local job has neither: ("", 0)). A job pending past `max_pending_s` is
    cancelled, and one LaunchError says so."""
    results = [job.task(k).paths.result_pickle for k in range(job.num_tasks)]
    checked_at, ended_at, end, pending_since = -math.inf, None, None, None
    while not all(path.exists() for path in results):
        now = time.monotonic()
        if now - checked_at >= STATE_EVERY_S[kind]:
            (end, pending), checked_at = job_state(job, kind), now
            ended_at = (ended_at or now) if end else None
            pending_since = (pending_since or now) if pending else None
            if max_pending_s and pending_since is not None and now - pending_since > max_pending_s:
                job.cancel(check=False)
                raise LaunchError(
                    f"slurm job {job.job_id} stayed pending for {now - pending_since:.0f} s ({pending}), past "
                    f"resilience.max_pending_s ({max_pending_s:.0f} s), and was cancelled; free or grow the "
                    "partition, ask for fewer nodes, or raise the limit"
                )
        if ended_at is not None and now - ended_at >= SETTLE_S[kind]:
            return end
        time.sleep(1.0)
    return None


def show_job(job_id: str) -> subprocess.CompletedProcess:
    """scontrol's one-line record of a Slurm job (its fields as Name=value), while slurmctld remembers the job."""
    return subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)


def job_state(job: submitit.Job, kind: str) -> tuple[tuple[str, int] | None, str]:
    """The final state and requeue count of a job that has ended (None while it runs or may run again), and why it
    is pending where it is (scontrol's reason, e.g. 'Reason=Resources'; '' otherwise)."""
    if kind == "local":
        return (None if job.state == "RUNNING" else ("", 0)), ""  # its controller process has exited
    out = show_job(job.job_id)
    if state := re.search(r"\bJobState=(\S+)", out.stdout):
        restarts = re.search(r"\bRestarts=(\d+)", out.stdout)
        reason = re.search(r"\bReason=(\S+)", out.stdout)
        pending = f"Reason={reason[1] if reason else 'None'}" if state[1] == "PENDING" else ""
        return ((state[1], int(restarts[1]) if restarts else 0) if state[1] in ENDED else None), pending
    if "Invalid job id" not in out.stderr:
        log.warning(
            "Could not read the state of slurm job %s (scontrol: %s); kept waiting",
            job.job_id,
            out.stderr.strip() or f"exit status {out.returncode}",
        )
        return None, ""
    # slurmctld forgets a job MinJobAge after its end; then only accounting, where there is any, knows its state.
    acct = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job.job_id], capture_output=True, text=True)
    words = acct.stdout.split() if acct.returncode == 0 else []
    return ((words[0] if words else "UNKNOWN"), 0), ""  # "CANCELLED by 0": the state is the first word


NODE_DOWN = re.compile(r"down|drain|fail|not_responding|boot", re.IGNORECASE)
"""A node state (sinfo's %T) in which Slurm keeps jobs off the node."""


def lost_nodes(job_id: str) -> list[str]:
    """The nodes of a Slurm job that Slurm now holds down, drained or failed (its NodeList, read from scontrol while
    slurmctld remembers the job), in order; [] where none is or the job is forgotten."""
    nodelist = re.search(r"\bNodeList=(\S+)", show_job(job_id).stdout)
    if not nodelist or nodelist[1] == "(null)":
        return []
    out = subprocess.run(["sinfo", "-h", "-N", "-n", nodelist[1], "-o", "%N %T"], capture_output=True, text=True)
    states = dict(line.split(maxsplit=1) for line in out.stdout.splitlines() if " " in line)
    return [node for node, state in states.items() if NODE_DOWN.search(state)]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def cancel_on_interrupt(job: submitit.Job, kind: str, owned: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """Cancel the job if the waiting process is stopped (Ctrl-C, or SIGTERM from Snakemake cancelling
    its local rule): an orphaned training job would keep writing the checkpoints a rerun writes too. A job another
    stage has re-attached to (`owned` false) is that stage's: it runs on."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
    try:
        yield
    except KeyboardInterrupt:
        if owned():
            job.cancel(check=False)
            log.warning("Cancelled %s job %s: the stage waiting for it was interrupted", kind, job.job_id)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)  # None: a handler installed outside Python
