"""Waiting for a job and naming why it ended without every task's result, in one line.

    python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=KILL   # a dead rank

The line names the likeliest cause: the state of a job Slurm stopped (TIMEOUT, CANCELLED, NODE_FAIL...),
else the first rank that died (its host, and the signal or exit code that srun, or for a local job
executors.LocalController, wrote in the job's log), else the first rank that raised. Each task's marker
(task.py) says where it ran and whether its code ended; a rank whose code never ended died abruptly.
The wait is bounded: submitit learns a Slurm job's end only from sacct and, without accounting, waits
forever for a job that ended without a result; here the state comes from scontrol (sacct once
slurmctld forgot it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import submitit
from submitit.core.utils import pickle_load
from submitit.local.local import LocalJob

from trainflow.errors import TrainflowError
from trainflow.launch.task import task_marker

log = logging.getLogger(__name__)

ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
"""Slurm's final job states; a requeued job is PENDING again under the same id."""
STOPPED = ENDED - {"COMPLETED", "FAILED"}
"""Final states set by Slurm or an operator, not by the tasks: the state itself is the cause."""
STATE_EVERY_S = {"local": 1.0, "slurm": 5.0}
"""Seconds between looks at a job's state while its result files are missing (looked at every second)."""
SETTLE_S = {"local": 0.0, "slurm": 15.0}
"""Seconds a job must stay ended before its missing results count as lost: a shared file system shows files
late, and a requeued Slurm job may pass a final-looking state before it is PENDING again. A local job's
controller exits after its tasks, on this machine's file system."""
TASK_END = re.compile(r"^(?:srun|trainflow-local): error: (\S+): tasks? ([\d,-]+): (.+)$", re.MULTILINE)
"""The line srun writes into the job's log for each task that ended abnormally; LocalController writes it too."""
SIGNAL_NAMES = {text: s.name for s in signal.Signals if (text := signal.strsignal(s))}
"""srun words a task's signal as strsignal(3) does ("Killed"); the signal's own name is what people search for."""

REMEDIES = (
    (
        re.compile(r"timed out|timeout|watchdog", re.IGNORECASE),
        "the seed's remedy for collective timeouts: check the network's RDMA / transport configuration "
        "(libfabric, aws-ofi-nccl, NCCL_IB_* / FI_* in cluster.runtime.env), rerun with NCCL_DEBUG=INFO in "
        "cluster.runtime.env, and raise cluster.runtime.collective_timeout_s (seed: 300 s) if the links are only slow",
    ),
    (
        re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE),
        "the seed's remedy for device memory: rerun with CUDA_LAUNCH_BLOCKING=1 in cluster.runtime.env to find the "
        "kernel and read the caching allocator's state (torch.cuda.memory_summary()); python -m trainflow.plan shows "
        "which term overflows (train.activations=recompute, parallel.dp_mode=shard, more tp / pp)",
    ),
)
"""(what a failed rank's last line matches, what to do about it): the seed's troubleshooting guide (section 4.1)."""


class LaunchError(TrainflowError):
    """A distributed job that ended without every task's result; the message names the cause and a log file."""


def run_job(executor: submitit.Executor, fn: object) -> list:
    """Submit `fn`, wait, and return every task's result; a failure becomes one LaunchError line."""
    job = executor.submit(fn)
    kind = "local" if isinstance(job, LocalJob) else "slurm"
    log.info("Submitted %s job %s (world size %d); logs in %s", kind, job.job_id, job.num_tasks, job.paths.folder)
    with cancel_on_interrupt(job, kind):
        end = wait_for_end(job, kind)
    outcomes = [
        pickle_load(path) if (path := job.task(k).paths.result_pickle).exists() else None for k in range(job.num_tasks)
    ]
    if all(outcome and outcome[0] == "success" for outcome in outcomes):
        return [outcome[1] for outcome in outcomes]
    raise LaunchError(failure_line(job, kind, end or ("", 0), outcomes))


def wait_for_end(job: submitit.Job, kind: str) -> tuple[str, int] | None:
    """Wait until every task's result file exists (None) or the job has ended without them: then its final
    Slurm state and requeue count (a local job has neither: ("", 0))."""
    results = [job.task(k).paths.result_pickle for k in range(job.num_tasks)]
    checked_at, ended_at, end = -math.inf, None, None
    while not all(path.exists() for path in results):
        now = time.monotonic()
        if now - checked_at >= STATE_EVERY_S[kind]:
            end, checked_at = ended_state(job, kind), now
            ended_at = (ended_at or now) if end else None
        if ended_at is not None and now - ended_at >= SETTLE_S[kind]:
            return end
        time.sleep(1.0)
    return None


def ended_state(job: submitit.Job, kind: str) -> tuple[str, int] | None:
    """The final state and requeue count of a job that has ended; None while it runs or may run again."""
    if kind == "local":
        return None if job.state == "RUNNING" else ("", 0)  # its controller process has exited
    out = subprocess.run(["scontrol", "show", "job", "-o", job.job_id], capture_output=True, text=True)
    if state := re.search(r"\bJobState=(\S+)", out.stdout):
        restarts = re.search(r"\bRestarts=(\d+)", out.stdout)
        return (state[1], int(restarts[1]) if restarts else 0) if state[1] in ENDED else None
    if "Invalid job id" not in out.stderr:
        log.warning(
            "Could not read the state of slurm job %s (scontrol: %s); kept waiting",
            job.job_id,
            out.stderr.strip() or f"exit status {out.returncode}",
        )
        return None
    # slurmctld forgets a job MinJobAge after its end; then only accounting, where there is any, knows its state.
    acct = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job.job_id], capture_output=True, text=True)
    words = acct.stdout.split() if acct.returncode == 0 else []
    return (words[0] if words else "UNKNOWN"), 0  # "CANCELLED by 0": the state is the first word


def failure_line(job: submitit.Job, kind: str, end: tuple[str, int], outcomes: list) -> str:
    """Why the job ended without every task's result, in one line naming the job and a log file."""
    state, requeues = end
    ended = f" {state}" if state else ""
    if requeues:
        ended += f" after {requeues} requeue{'s' * (requeues > 1)}"
    if state not in STOPPED and (failed := first_failed_rank(job, outcomes)):
        rank, host, what = failed
        where = f" on host {host}" if host else ""
        log_file = job.task(rank).paths.stderr
        return f"rank {rank}{where} {what} ({kind} job {job.job_id}{ended}, full log: {log_file}){remedy(what)}"
    unfinished = ranks([k for k, outcome in enumerate(outcomes) if not outcome or outcome[0] != "success"])
    return f"{kind} job {job.job_id} ended{ended} without the results of {unfinished} (full log: {job.paths.stderr})"


def first_failed_rank(job: submitit.Job, outcomes: list) -> tuple[int, str, str] | None:
    """(rank, host, what happened to it) of the rank that failed first: one that died abruptly (no result, and
    its code never ended), else one that raised; among several, the first whose abnormal end the log reported."""
    markers = {
        k: json.loads(path.read_text())
        for k in range(job.num_tasks)
        if (path := task_marker(job.task(k).paths)).exists()
    }
    ends = reported_ends(job.paths.stderr)
    died = [
        k
        for k, outcome in enumerate(outcomes)
        if outcome is None and (k in markers or k in ends) and "ended" not in markers.get(k, {})
    ]
    raised = [k for k, outcome in enumerate(outcomes) if outcome and outcome[0] == "error"]
    reported = {k: position for position, k in enumerate(ends)}
    for candidates in (died, raised):
        if candidates:
            rank = min(candidates, key=lambda k: (reported.get(k, math.inf), k))
            host = markers[rank]["host"] if rank in markers else ends[rank][0] if rank in ends else ""
            if outcomes[rank]:
                return rank, host, f"raised {last_line(outcomes[rank][1])}"
            return rank, host, ends[rank][1] if rank in ends else "ended abruptly, with no exit status in the log"
    return None


def reported_ends(log_file: Path) -> dict[int, tuple[str, str]]:
    """Rank -> (host, what happened) of each abnormal end reported in the job's log, the latest per rank (a
    requeued job appends to the same log), ordered as reported."""
    ends: dict[int, tuple[str, str]] = {}
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    for host, tasks, how in TASK_END.findall(text):
        signame = SIGNAL_NAMES.get(how)
        code = re.fullmatch(r"Exited with exit code (\d+)", how)
        what = f"was killed by {signame}" if signame else f"exited with code {code[1]}" if code else f"ended: {how}"
        for part in tasks.split(","):
            first, _, last = part.partition("-")
            for rank in range(int(first), int(last or first) + 1):
                ends.pop(rank, None)
                ends[rank] = (host, what)
    return ends


def remedy(what: str) -> str:
    """'; <the seed's remedy>' for a failure it names one for, else ''."""
    return next((f"; {text}" for pattern, text in REMEDIES if pattern.search(what)), "")


def last_line(trace: str) -> str:
    """The exception line of a task's traceback."""
    return next((line.strip() for line in reversed(trace.splitlines()) if line.strip()), "no traceback")


def ranks(ks: list[int]) -> str:
    """'rank 3' or 'ranks 0-3, 6'."""
    spans: list[list[int]] = []
    for k in sorted(ks):
        if spans and k == spans[-1][1] + 1:
            spans[-1][1] = k
        else:
            spans.append([k, k])
    return f"rank{'s' * (len(ks) > 1)} " + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def cancel_on_interrupt(job: submitit.Job, kind: str) -> Iterator[None]:
    """Cancel the job if the waiting process is stopped (Ctrl-C, or SIGTERM from Snakemake cancelling
    its local rule): an orphaned training job would keep writing the checkpoints a rerun writes too."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
    try:
        yield
    except KeyboardInterrupt:
        job.cancel(check=False)
        log.warning("Cancelled %s job %s: the stage waiting for it was interrupted", kind, job.job_id)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)  # None: a handler installed outside Python
