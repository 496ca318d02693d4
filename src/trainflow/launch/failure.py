"""Why a job ended without every task's result: the one line a stage fails with, and the facts a restart decides on.

    failure = analyse(job, "local", ("", 0), outcomes)   # launch.job_end does, for every failed job

The line names the likeliest cause: a hang the job's own ranks diagnosed (launch.heartbeat), else a node that failed
(NODE_FAIL, BOOT_FAIL: the node Slurm holds down; srun's "Node failure on" line in a job that outlives it), else the
state of a job Slurm stopped (TIMEOUT, CANCELLED...), else the first rank that died (its host, and the signal or exit
code that srun, or for a local job executors.LocalController, wrote in the job's log), else the first rank that
raised. Each task's marker (task.py) says where it ran, whether its code ended and, if it raised, whether the error
was one of trainflow's own (a TrainflowError: a config, data or checkpoint problem that no restart fixes); a rank
whose code never ended died abruptly.
"""

from __future__ import annotations

import functools
import math
import re
import signal
from collections.abc import Sequence
from pathlib import Path

import submitit

from trainflow.launch.hang import read_report
from trainflow.launch.task import TaskMarker, read_marker, task_marker
from trainflow.resilience.flight import read_dumps, stuck
from trainflow.resilience.ledger import JobOutcome
from trainflow.resilience.verdict import JobFailure

TASK_END = re.compile(r"^(?:srun|trainflow-local): error: (\S+): tasks? ([\d,-]+): (.+)$", re.MULTILINE)
"""The line srun writes into the job's log for each task that ended abnormally; LocalController writes it too."""
NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)$", re.MULTILINE)
"""srun's line for a node of its step that failed (a job that survives it, sbatch --no-kill, loses only its steps
there): the ranks it kills elsewhere are reported too, and are not the cause."""
LAUNCH_FAILURE = re.compile(r"^srun: error: Task launch for \S+ failed on node (\S+): (.+)$", re.MULTILINE)
"""srun's line for a node its step's tasks could not start on: its slurmd does not answer (dead, hung, unreachable)
before Slurm has noticed (SlurmdTimeout); no rank ran, so no marker or result says anything."""
SIGNAL_NAMES = {text: s.name for s in signal.Signals if (text := signal.strsignal(s))}
"""srun words a task's signal as strsignal(3) does ("Killed"); the signal's own name is what people search for."""

ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
"""Slurm's final job states; a requeued job is PENDING again under the same id."""
STOPPED = ENDED - {"COMPLETED", "FAILED"}
"""Final states set by Slurm or an operator, not by the tasks: the state itself is the cause."""
NODE_FAULTS = frozenset({"NODE_FAIL", "BOOT_FAIL"})
"""Final states of a job whose node failed (while it ran, or as it booted): the node is the cause, and the job is a
rank's death on it (JobOutcome.DIED), which a restart leaves out (resilience.verdict)."""

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


def analyse(job: submitit.Job, kind: str, end: tuple[str, int], outcomes: list, lost: Sequence[str] = ()) -> JobFailure:
    """Why the job ended without every task's result (the module docstring's order of causes); `lost`: the job's nodes
    Slurm holds down or failed, for a NODE_FAIL or BOOT_FAIL (launch.job_end.lost_nodes)."""
    state, requeues = end
    ended = f" {state}" if state else ""
    if requeues:
        ended += f" after {requeues} requeue{'s' * (requeues > 1)}"
    markers = read_markers(job)
    errors = {k: exception_line(outcome[1]) for k, outcome in enumerate(outcomes) if outcome and outcome[0] == "error"}
    expected = any(m.expected for m in markers.values())
    hosts = {k: m.host for k, m in markers.items()}
    failure = functools.partial(
        JobFailure, state=state, errors=errors, expected=expected, world=job.num_tasks, hosts=hosts
    )
    if hang := read_report(job.paths):
        stacks = job.paths.folder / f"{job.job_id}_<rank>_stacks.txt"
        flight = stuck(read_dumps(job.paths.folder, str(job.job_id)))
        said = f"; {flight.line()}" if flight else ""
        line = f"{hang.line()}{said} ({kind} job {job.job_id}{ended}; every live rank's stacks in {stacks})"
        return failure(
            line=line,
            kind=JobOutcome.HANG,
            rank=hang.rank,
            host=hang.host,
            step=hang.step,
        )
    reported = reported_node_failures(job.paths.stderr)
    lost = [*lost, *reported]
    if state in NODE_FAULTS or lost:
        host = lost[0] if lost else ""
        which = f"node {host} {reported.get(host, 'failed')}" if host else "a node Slurm no longer lists as down failed"
        line = f"{kind} job {job.job_id} ended{ended}: {which} (full log: {job.paths.stderr})"
        return failure(
            line=line,
            kind=JobOutcome.DIED,
            rank=min((k for k, m in markers.items() if m.host == host), default=None),
            host=host,
        )
    if state not in STOPPED and (failed := first_failed_rank(job, outcomes, markers)):
        rank, host, what = failed
        where = f" on host {host}" if host else ""
        line = f"rank {rank}{where} {what} ({kind} job {job.job_id}{ended}, full log: {job.task(rank).paths.stderr})"
        return failure(
            line=line + remedy(what),
            kind=JobOutcome.RAISED if rank in errors else JobOutcome.DIED,
            rank=rank,
            host=host,
            step=markers[rank].step if rank in markers else None,
        )
    unfinished = ranks([k for k, outcome in enumerate(outcomes) if not outcome or outcome[0] != "success"])
    line = f"{kind} job {job.job_id} ended{ended} without the results of {unfinished} (full log: {job.paths.stderr})"
    return failure(
        line=line,
        kind=JobOutcome.STOPPED if state in STOPPED else JobOutcome.LOST,
    )


def read_markers(job: submitit.Job) -> dict[int, TaskMarker]:
    """Each task's marker (task.py), by rank, for the tasks that wrote one."""
    return {k: read_marker(path) for k in range(job.num_tasks) if (path := task_marker(job.task(k).paths)).exists()}


def first_failed_rank(job: submitit.Job, outcomes: list, markers: dict[int, TaskMarker]) -> tuple[int, str, str] | None:
    """(rank, host, what happened to it) of the rank that failed first: one that died abruptly (no result, and
    its code never ended), else one that raised; among several, one whose error is not its peer's loss (PEER_LOST:
    the ranks a failed rank leaves behind raise that, as fast as it ends), then the first whose abnormal end the log
    reported."""
    ends = reported_ends(job.paths.stderr)
    died = [
        k
        for k, outcome in enumerate(outcomes)
        if outcome is None and (k in markers or k in ends) and (k not in markers or markers[k].ended is None)
    ]
    raised = [k for k, outcome in enumerate(outcomes) if outcome and outcome[0] == "error"]
    reported = {k: position for position, k in enumerate(ends)}
    for candidates in (died, raised):
        if candidates:
            rank = min(candidates, key=lambda k: (peer_lost(outcomes[k]), reported.get(k, math.inf), k))
            host = markers[rank].host if rank in markers else ends[rank][0] if rank in ends else ""
            if outcomes[rank]:
                return rank, host, f"raised {exception_line(outcomes[rank][1])}"
            return rank, host, ends[rank][1] if rank in ends else "ended abruptly, with no exit status in the log"
    return None


PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|caused by a remote worker crashing|remote process exited",
    re.IGNORECASE,
)
"""The collectives' words for a peer that went away (gloo's, NCCL's): the consequence of another rank's failure."""


def peer_lost(outcome: tuple | None) -> bool:
    return bool(outcome) and outcome[0] == "error" and bool(PEER_LOST.search(exception_line(outcome[1])))


def reported_ends(log_file: Path) -> dict[int, tuple[str, str]]:
    """Rank -> (host, what happened) of each abnormal end reported in the job's log, the latest per rank (a
    requeued job appends to the same log), ordered as reported."""
    return ends_in(log_file.read_text(errors="replace") if log_file.exists() else "")


def ends_in(text: str) -> dict[int, tuple[str, str]]:
    """reported_ends of a log's `text`."""
    ends: dict[int, tuple[str, str]] = {}
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


def reported_node_failures(log_file: Path) -> dict[str, str]:
    """The nodes srun reported failed in the job's (or job step's) log, in order, each with what it did: 'failed', or
    could not start the step's tasks (LAUNCH_FAILURE)."""
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    found = [(m.start(), m[1], "failed") for m in NODE_FAILURE.finditer(text)]
    found += [(m.start(), m[1], f"could not start the step's tasks ({m[2]})") for m in LAUNCH_FAILURE.finditer(text)]
    nodes: dict[str, str] = {}
    for _, host, what in sorted(found):
        nodes.setdefault(host, what)
    return nodes


def remedy(what: str) -> str:
    """'; <the seed's remedy>' for a failure it names one for, else ''."""
    return next((f"; {text}" for pattern, text in REMEDIES if pattern.search(what)), "")


def exception_line(trace: str) -> str:
    """The exception a task's traceback ends in: its type and the first line of its message. Not the traceback's
    last line: a CUDA error's message goes on with hints that are the same for every CUDA error (TORCH_USE_CUDA_DSA's),
    which made an ECC error and an illegal memory access on two hosts look like one exception twice."""
    lines = trace.splitlines()
    last = next((line.strip() for line in reversed(lines) if line.strip()), "no traceback")
    header = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not header:
        return last
    # After the last traceback's frames (indented), the exception: "Type: message", the message's first line.
    body = (line for line in lines[header[-1] + 1 :] if line.strip() and not line[0].isspace())
    return next(body, last).strip()


def ranks(ks: list[int]) -> str:
    """'rank 3' or 'ranks 0-3, 6'."""
    spans: list[list[int]] = []
    for k in sorted(ks):
        if spans and k == spans[-1][1] + 1:
            spans[-1][1] = k
        else:
            spans.append([k, k])
    return f"rank{'s' * (len(ks) > 1)} " + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)
