"""The files of a run folder a restart reads for the hosts to leave out: the gate's nccl-exclude.txt (blames with a
way back, as a failure's: resilience.probation) and a failed job's timing file (its stragglers); and the jobs ledger's
record of a job or job step that ended. Whether to restart, and the failed host, are resilience.verdict's.

    gate = gate_blames(RunFolder.of(cfg).nccl_exclude)   # {host: Probation("the gate", <when it was written>)}
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from pathlib import Path

import submitit
from submitit.core.utils import JobPaths

from trainflow.checkpoint.folders import list_steps
from trainflow.config import TrainflowConfig
from trainflow.config.startup import RANK_PARTS, StartupPart
from trainflow.launch.failure import read_markers
from trainflow.launch.heartbeat import timing_path
from trainflow.launch.task import TaskMarker
from trainflow.records import RecordError, read_file
from trainflow.resilience.ledger import JobOutcome, JobRun, Probation, checked_hosts
from trainflow.resilience.timing import RankTiming, stragglers
from trainflow.resilience.verdict import JobFailure


def gate_exclusions(path: str | Path) -> frozenset[str]:
    """The hosts validate_nccl's gate wrote to leave out (nccl-exclude.txt, comma-separated); none when absent."""
    try:
        text = read_file(path, fix="rerun validate_nccl to write it again")
    except FileNotFoundError:
        return frozenset()
    hosts = [h.strip() for h in text.replace("\n", ",").split(",") if h.strip()]
    return checked_hosts(hosts, str(path))


def gate_blames(path: str | Path) -> dict[str, Probation]:
    """The gate's hosts as blames from the time it wrote them (the file's modification time), which return as a
    failure's do (resilience.probation: Slurm's hold and service again, or a reboot, since then)."""
    hosts = gate_exclusions(path)
    since = Path(path).stat().st_mtime if hosts else 0.0
    return {host: Probation("the gate", since) for host in sorted(hosts)}


def straggler_hosts(paths: JobPaths, factor: float) -> frozenset[str]:
    """The hosts of the ranks a failed job's heartbeat last timed as stragglers (launch.heartbeat's timing file);
    none when it wrote none (a job shorter than a minute) or one that does not read."""
    path = timing_path(paths)
    timings: list[RankTiming] = []
    with contextlib.suppress(OSError, ValueError, TypeError, RecordError):
        timings = [RankTiming.from_json(t, where=str(path)) for t in json.loads(path.read_text())]
    return checked_hosts({t.host for t in stragglers(timings, factor)}, str(path))


def job_run(
    cfg: TrainflowConfig,
    job: submitit.Job,
    *,
    attempt: int,
    submitted: float,
    exclude: frozenset[str],
    failure: JobFailure | None,
    step: int | None = None,
    job_id: str = "",
) -> JobRun:
    """The ledger's record of a job (or, with `step`, a hot restart's job step `job_id`) that ended; its verdict and
    blamed hosts are added once judged."""
    markers = read_markers(job).values()
    steps = list_steps(Path(cfg.io.checkpoints))
    return JobRun(
        segment=cfg.segment,
        attempt=attempt,
        job_id=job_id or str(job.job_id),
        submitted=submitted,
        started=min((m.started for m in markers), default=submitted),
        ended=time.time(),
        outcome=failure.kind if failure else JobOutcome.COMPLETED,
        line=failure.line if failure else "",
        exclude=sorted(exclude),
        checkpoint=steps[-1] if steps else -1,
        step=step,
        parts=startup_parts(markers, submitted),
    )


def startup_parts(markers: Iterable[TaskMarker], submitted: float) -> dict[str, float]:
    """Seconds of each part of the ranks' start-up (config.startup.RANK_PARTS, in order), each ending when its last
    rank ended it, the first from `submitted`; a part no rank recorded is left out (the next one holds its time)."""
    markers = list(markers)
    ends = {part: [m.parts[part] for m in markers if part in m.parts] for part in RANK_PARTS[:-1]}
    ends[StartupPart.FIRST_STEP] = [m.first_step for m in markers if m.first_step is not None]
    parts, since = {}, submitted
    for part in RANK_PARTS:
        if ends[part]:
            parts[part.value], since = max(ends[part]) - since, max(ends[part])
    return parts


def first_step_at(job: submitit.Job) -> float | None:
    """When the job's first trained step ended on its first rank to end one (task markers); None: no rank did."""
    return min((m.first_step for m in read_markers(job).values() if m.first_step is not None), default=None)
