"""Goodput, measured: where a segment's wall time went, from the jobs train_segment ran (jobs.jsonl) and rank 0's
ledger of each job's spans (spans.jsonl), beside the checkpoints. Nothing here imports torch.

    python -c "from trainflow.records import read_record; from trainflow.train.summary import SegmentSummary; \
        print(read_record(SegmentSummary, 'runs/default/train/<series>/segment-0.json').goodput.seconds)"

The wall time runs from the first job's submission to the last job's end, over the jobs since the segment last
completed (a rerun by hand after a failure is part of it: its wait is the restart gap a person cost). It splits into
- productive: the steps the final model contains (the last run of each step), each with its bookkeeping up to the
  next span (its records, the stop-signal agreement: the loop's cost per step); goodput = productive / wall;
- evaluation, checkpoint (the time the step loop was blocked saving), load (reading a checkpoint back);
- recomputed: steps and evaluations redone after a failure or a rollback (all runs of a step but its last);
- skipped: steps the loss guard did not apply;
- queue: submission to the first rank's start; start-up: a job's start, or a requeue, to its first span (process
  group, model build, compile) and any wait before a load;
- detection: a failed job's last span to its end as the stage saw it (the lost partial step, the wait until the
  failure was detected and every rank ended); shutdown: a completed job's last span to its end;
- restart: one job's end to the next one's submission (the verdict, a person);
- other: the gaps inside a job that none of the above covers (after a save or a load, before the next span).
Every term is measured on its own; `unaccounted` is what the wall time holds beyond their sum (clock skew, overlap).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.records import Record
from trainflow.resilience.ledger import NO_FAILURE, JobOutcome, JobRun

TERMS = (
    "productive",
    "evaluation",
    "checkpoint",
    "load",
    "recomputed",
    "skipped",
    "queue",
    "start-up",
    "detection",
    "shutdown",
    "restart",
    "other",
)


@dataclass(frozen=True)
class Span(Record):
    """A stretch of a training job's wall time on rank 0 (the measured goodput's ledger, spans.jsonl): never dropped,
    so work a failure or rollback made the segment redo stays on record as redone."""

    segment: int
    kind: str
    """step, skipped (a step the guard did not apply), eval, save (the time the step loop was blocked) or load."""
    step: int
    started: float
    """Wall-clock time (time.time())."""
    seconds: float


@dataclass(frozen=True)
class Goodput(Record):
    wall_s: float
    seconds: dict[str, float]
    """Each of TERMS."""
    goodput: float
    """productive / wall."""
    unaccounted: float
    """Share of the wall time no term holds: |wall - sum| / wall."""
    jobs: list[JobRun]


def segment_jobs(jobs: list[JobRun], segment: int) -> list[JobRun]:
    """The segment's jobs since it last completed before its final job."""
    mine = [j for j in jobs if j.segment == segment]
    start = next((k + 1 for k in range(len(mine) - 2, -1, -1) if mine[k].outcome == JobOutcome.COMPLETED), 0)
    return mine[start:]


def measure_goodput(jobs: list[JobRun], spans: list[Span]) -> Goodput:
    """Split the wall time of `jobs` (one segment's, in order) by TERMS, from the spans each job's rank 0 wrote."""
    seconds, segment = dict.fromkeys(TERMS, 0.0), jobs[0].segment
    spans = sorted(
        (s for s in spans if s.segment == segment and jobs[0].submitted <= s.started <= jobs[-1].ended),
        key=lambda s: s.started,
    )
    last = {work(s): k for k, s in enumerate(spans)}  # the run of each step (and evaluation) the model kept
    for n, job in enumerate(jobs):
        seconds["queue"] += job.started - job.submitted
        if n:
            seconds["restart"] += job.submitted - jobs[n - 1].ended
        cursor, before = job.started, "start-up"  # the term a gap before the next span counts under
        for k, span in enumerate(spans):
            if not job.started <= span.started <= job.ended:
                continue
            seconds["start-up" if span.kind == "load" else before] += max(span.started - cursor, 0.0)
            seconds[kind := term(span, last[work(span)] == k)] += span.seconds
            cursor = max(cursor, span.started + span.seconds)
            before = kind if span.kind in ("step", "skipped", "eval") else "other"  # a step's bookkeeping is its own
        seconds["detection" if job.outcome not in NO_FAILURE else "shutdown"] += max(job.ended - cursor, 0.0)
    wall = jobs[-1].ended - jobs[0].submitted
    return Goodput(
        wall_s=wall,
        seconds=seconds,
        goodput=seconds["productive"] / wall if wall > 0 else 0.0,
        unaccounted=abs(wall - sum(seconds.values())) / wall if wall > 0 else 0.0,
        jobs=jobs,
    )


def work(span: Span) -> tuple[str, int]:
    """What a span did, as later runs of the same work share it: a step (applied or skipped), an evaluation, or a
    save or load (each its own)."""
    return ("step" if span.kind in ("step", "skipped") else span.kind, span.step)


def term(span: Span, kept: bool) -> str:
    """The term a span's seconds count under: its kind's, or recomputed for work a later run redid."""
    if span.kind in ("save", "load"):
        return "checkpoint" if span.kind == "save" else "load"  # a save redone is still a save's blocking time
    if not kept:
        return "recomputed"
    return {"step": "productive", "skipped": "skipped", "eval": "evaluation"}[span.kind]
