"""Reading a campaign's run folder into one CampaignStatus, torch-free and read-only: what train_segment's rank 0
appends (steps.jsonl, spans.jsonl, jobs.jsonl, hosts.jsonl, beside the checkpoints), the segments' summaries, the
checkpoints' manifests, verify.json and nccl-exclude.txt. The files may be hostile: anything that does not read as the
record it should be is one error line naming the file and line (a StatusError, or the records' RecordError: the
logs are read as trainflow.journal reads them, the jobs and hosts ledgers through resilience.ledger).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from statistics import median

from trainflow.campaign.records import StepChange
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import ChecksumError, check_complete, read_manifest
from trainflow.checkpoint.verify import VerifyReport
from trainflow.config.run_folder import RunFolder
from trainflow.errors import TrainflowError
from trainflow.evaluate.records import EvalRecord
from trainflow.journal import Journal
from trainflow.launch.restart import gate_blames
from trainflow.records import Record, read_record
from trainflow.resilience.goodput import Span, measure_goodput, segment_jobs
from trainflow.resilience.ledger import (
    NO_FAILURE,
    HostEvent,
    JobRun,
    checked_hosts,
    hosts_ledger,
    jobs_ledger,
    standing,
)
from trainflow.train.run_record import RunRecord
from trainflow.train.step_log import StepRecord
from trainflow.train.summary import SegmentSummary

RECENT = 20
"""The step records the step time and throughput are the median of: the newest, not the warm-up."""
MAX_STEPS = 2**53
"""More steps than a float counts exactly: a run.json that claims them was altered."""


class StatusError(TrainflowError):
    """A run folder that does not read as a campaign's."""


class NotStartedError(StatusError):
    """A run folder whose campaign has not started training yet (its data is prepared, staged or gated first)."""


class State(StrEnum):
    FINISHED = "finished"
    RUNNING = "running"
    BETWEEN_JOBS = "between jobs"
    """The in-flight segment's last job ended and no newer one has written a step: a restart (or a requeue) waits
    in the queue, or the stage gave up (the last failure's verdict says which)."""
    WAITING = "waiting"
    """No job of the next segment has written a record yet: it is queued, or the workflow has not submitted it."""


@dataclass(frozen=True)
class CheckpointState(Record):
    step: int
    """The newest checkpoint whose folder holds exactly what its manifest lists (the one a restart resumes from)."""
    verified: bool
    """Its files re-read against their CRC-32C by verify_checkpoint (verify.json); until then only the CRCs
    computed while they were written stand for them."""
    skipped: list[str] = field(default_factory=list)
    """Why each newer checkpoint folder was passed over."""


@dataclass(frozen=True)
class CampaignStatus(Record):
    run: str
    series: str
    folder: str
    state: State
    segments: int
    done: list[int]
    in_flight: int | None
    """The first segment without a summary (None: all have one)."""
    step: int
    """Steps done: the next step to run."""
    total_steps: int
    loss: float | None
    step_s: float | None
    tokens_per_s: float | None
    last_step_age_s: float | None
    """Seconds since the newest step record's step ended."""
    checkpoint: CheckpointState | None
    failures: list[JobRun]
    """Every job that did not complete, with its verdict (jobs.jsonl)."""
    restarts: int
    """Jobs started after a failure: those on record, and the in-flight segment's running one."""
    requeues: int
    """Slurm's requeues of the finished segments' jobs (their summaries' restart_count)."""
    excluded: list[str]
    """Hosts the next job leaves out: the NCCL gate's and the newest job's, but those Slurm has returned since."""
    returned: list[HostEvent]
    """Hosts a failure blamed that Slurm has returned to service since (hosts.jsonl), each with its evidence."""
    goodput: float | None
    """Productive seconds over wall seconds, over every finished segment and the in-flight one so far."""
    wall_s: float
    eta_s: float | None
    """The remaining steps at the measured step time."""
    eta_wall_s: float | None
    """The same at the goodput so far (evaluations, saves, queues and restarts at their rate until now)."""
    last_change: StepChange | None = None
    """The newest setting a job changed against the checkpoint it resumed from (changes.jsonl; the lineage)."""
    evaluation: EvalRecord | None = None
    """The evaluate stage's record of the series' newest evaluated checkpoint (None: none evaluated yet)."""


def read_status(
    folder: str | Path, *, checkpoints: str | Path | None = None, now: float | None = None
) -> CampaignStatus:
    """The status of the newest campaign under the run folder `folder` (runs/<run>); `checkpoints` names its
    checkpoint folder when that lies outside the run folder (storage.capacity elsewhere)."""
    root, now = Path(folder), time.time() if now is None else now
    record = newest_record(root)
    run = RunFolder(str(root), "", "", record.series)
    ckpts = Path(checkpoints) if checkpoints else inside(root, record.checkpoints)
    steps = Journal(RunFolder.steps_log(str(ckpts)), StepRecord).read(live=True)
    spans = Journal(RunFolder.spans_log(str(ckpts)), Span).read(live=True)
    ledger = jobs_ledger(ckpts)
    jobs = ledger.read(live=True)
    changes = Journal(RunFolder.changes_log(str(ckpts)), StepChange).read(live=True)
    if odd := next((r for r in steps if not 0 <= r.step < record.total_steps), None):
        last = record.total_steps - 1
        raise StatusError(
            f"{ckpts}/steps.jsonl holds step {odd.step}, outside the campaign's 0..{last}; it was altered"
        )
    summaries = read_summaries(run, record.segments)
    k = next((i for i in range(len(summaries) + 1) if i not in summaries), record.segments)
    state = segment_state(k, record.segments, spans, jobs)
    recent = steps[-RECENT:]
    step_s = median(r.step_s for r in recent) if recent else None
    productive, wall = goodput_terms(summaries, jobs, spans, k, state, now)
    goodput = productive / wall if wall > 0 else None
    remaining = record.total_steps - (step := max((r.step + 1 for r in steps), default=0))
    eta = remaining * step_s if step_s is not None and state is not State.FINISHED else None
    hosts = standing(jobs, hosts_ledger(ckpts).read(live=True), gate_blames(run.nccl_exclude))
    returned, excluded = hosts.returned, set(hosts.excluded)
    if jobs:
        excluded |= checked_hosts(jobs[-1].exclude, str(ledger.path)) - set(returned)
    return CampaignStatus(
        run=record.run,
        series=record.series,
        folder=run.train_dir,
        state=state,
        segments=record.segments,
        done=sorted(summaries),
        in_flight=k if k < record.segments else None,
        step=step,
        total_steps=record.total_steps,
        loss=steps[-1].loss if steps else None,
        step_s=step_s,
        tokens_per_s=median(r.tokens_per_s for r in recent) if recent else None,
        last_step_age_s=now - (steps[-1].started + steps[-1].step_s) if steps else None,
        checkpoint=newest_checkpoint(ckpts, Path(run.verify_report)),
        failures=[j for j in jobs if j.outcome not in NO_FAILURE],
        restarts=sum(j.attempt > 0 for j in jobs) + (state is State.RUNNING and restarted(jobs, k)),
        requeues=sum(s.restart_count for s in summaries.values()),
        excluded=sorted(excluded),
        returned=[returned[host] for host in sorted(returned)],
        goodput=goodput,
        wall_s=wall,
        eta_s=eta,
        eta_wall_s=eta / goodput if eta is not None and goodput else None,
        last_change=changes[-1] if changes else None,
        evaluation=newest_evaluation(run, record.segments),
    )


def newest_record(root: Path) -> RunRecord:
    """The run record of the campaign under `root` whose job started last (a changed setting starts a new one)."""
    if not root.is_dir():
        raise StatusError(f"{root} is no folder: pass the run folder, runs/<run> (storage.root)")
    paths = sorted(Path(root).glob(os.path.relpath(RunFolder(".", "", "", "*").run_record)), key=os.path.getmtime)
    if not paths and Path(RunFolder(str(root), "", "", "").log("any")).parent.parent.is_dir():
        raise NotStartedError(
            f"{root} is a run folder whose training has not started: no train_segment job has written "
            "train/<series>/run.json yet (its data is prepared, staged and gated first); ask again once it trains"
        )
    if not paths:
        raise StatusError(
            f"{root} holds neither train/<series>/run.json nor logs/: it is no run folder; pass runs/<run> (a campaign "
            "trained before trainflow wrote run.json shows from its next job)"
        )
    record = read_record(RunRecord, paths[-1], rerun="the next train_segment job (it rewrites the file)")
    if record.series != paths[-1].parent.name:
        raise StatusError(f"{paths[-1]} names the campaign {record.series!r}, not its folder's; the file was altered")
    if not (1 <= record.segments <= MAX_STEPS and 1 <= record.segment_steps and 0 <= record.total_steps <= MAX_STEPS):
        raise StatusError(
            f"{paths[-1]} claims {record.segments} x {record.segment_steps} steps (to step {record.total_steps}); the "
            "file was altered"
        )
    return record


def inside(root: Path, path: str) -> Path:
    """`path` (relative to the run folder) if it lies inside the run folder; else one StatusError."""
    try:
        resolved, top = (root / path).resolve(), root.resolve()
    except (RuntimeError, OSError) as err:  # RuntimeError: pathlib's word for a symlink loop
        raise StatusError(
            f"the run record's checkpoints {path!r} do not resolve under {root} ({err}); remove the loop"
        ) from None
    if not resolved.is_relative_to(top):
        raise StatusError(
            f"the run record names the checkpoints {path!r}, outside {root}; status reads only the run folder: pass "
            "--checkpoints DIR if they lie there on purpose"
        )
    return resolved


def read_summaries(run: RunFolder, segments: int) -> dict[int, SegmentSummary]:
    """The summaries of the finished segments, by segment."""
    found = {}
    for path in Path(run.train_dir).glob(Path(run.segment_report("*")).name):
        if (k := RunFolder.segment_of(path.name)) is not None and k < segments:
            found[k] = read_record(SegmentSummary, path, rerun=f"train_segment segment={k}")
    return found


def newest_evaluation(run: RunFolder, segments: int) -> EvalRecord | None:
    """The evaluation record of the series' newest evaluated segment (evaluate/<series>/segment-<i>.json)."""
    found = {
        k: path
        for path in Path(run.evaluate_dir).glob(Path(run.evaluation("*")).name)
        if (k := RunFolder.segment_of(path.name)) is not None and k < segments
    }
    return read_record(EvalRecord, found[max(found)], rerun="evaluate") if found else None


def segment_state(k: int, segments: int, spans: list[Span], jobs: list[JobRun]) -> State:
    """What segment k, the first without a summary, is doing (segments: the campaign is finished)."""
    if k >= segments:
        return State.FINISHED
    active = max((s.started + s.seconds for s in spans if s.segment == k), default=None)
    ended = max((j.ended for j in jobs if j.segment == k), default=None)
    if active is None and ended is None:
        return State.WAITING
    return State.RUNNING if ended is None or (active is not None and active > ended) else State.BETWEEN_JOBS


def restarted(jobs: list[JobRun], k: int) -> bool:
    """Whether segment k's running job is a restart: the segment's last job on record failed."""
    mine = [j for j in jobs if j.segment == k]
    return bool(mine) and mine[-1].outcome != "completed"


def goodput_terms(
    summaries: dict[int, SegmentSummary], jobs: list[JobRun], spans: list[Span], k: int, state: State, now: float
) -> tuple[float, float]:
    """Productive and wall seconds: the finished segments' measured goodput, and segment k's jobs so far, its
    running one from its first span to `now` (its queue and start-up are not on record yet)."""
    measured = [s.goodput for s in summaries.values() if s.goodput is not None]
    ended = segment_jobs(jobs, k) if any(j.segment == k for j in jobs) else []
    if state is State.RUNNING:
        since = ended[-1].ended if ended else -math.inf
        first = min((s.started for s in spans if s.segment == k and s.started > since), default=now)
        ended.append(JobRun(k, len(ended), "running", first, first, now, "running"))
    if ended and state is not State.FINISHED:
        measured.append(measure_goodput(ended, spans))
    return sum(g.seconds["productive"] for g in measured), sum(g.wall_s for g in measured)


def newest_checkpoint(ckpts: Path, verify_report: Path) -> CheckpointState | None:
    """The newest complete checkpoint (manifests only: no file is re-read), and whether verify.json lists it."""
    skipped = []
    for step in reversed(list_steps(ckpts)):
        folder = step_dir(ckpts, step)
        try:
            check_complete(folder, read_manifest(folder))
        except ChecksumError as err:
            skipped.append(str(err))
            continue
        verified = False
        if os.path.lexists(verify_report):  # a FIFO or a loop in its place is refused, not taken for none
            report = read_record(VerifyReport, verify_report, rerun="verify_checkpoint")
            verified = step in {c.step for c in report.checkpoints}
        return CheckpointState(step, verified, skipped)
    return None
