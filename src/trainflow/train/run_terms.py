"""A campaign's measured terms (plan.from_run.RunTerms), from its segments' goodput (resilience.goodput: the jobs
ledger and spans.jsonl): what the plan from the run's own terms is made of. train_segment writes them after every
segment (terms.json, beside the segments' summaries), so `python -m trainflow.plan --from-run` and the report read them.

    python -m trainflow.plan --from-run runs/default

A job after a failed one is a restart: its gap since the failure and its queue are the restart's wait, its start-up
and load up to its first step or evaluation its held time. Everything else that is neither a step, an evaluation, a
save, work redone nor a failure's detection is the planned job starts' (queue, start-up, load, shutdown, the gaps
inside a job, and what no term of resilience.goodput holds), so the terms add up to the wall time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainflow.atomic import write_text_atomic
from trainflow.badput import MEASURED, Badput
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.journal import Journal
from trainflow.plan.from_run import RunTerms
from trainflow.records import read_record
from trainflow.resilience.goodput import Span
from trainflow.resilience.ledger import NO_FAILURE, JobOutcome, JobRun
from trainflow.train.summary import SegmentSummary

WORK = ("step", "skipped", "eval")
"""The spans a restart's held time ends at."""


@dataclass
class Restarts:
    """The restarts of a campaign: how many, their waits and their held time, in seconds."""

    count: int = 0
    wait_s: float = 0.0
    held_s: float = 0.0

    def add(self, job: JobRun, before: JobRun, spans: Sequence[Span]) -> None:
        work = [s.started for s in spans if s.kind in WORK and job.started <= s.started <= job.ended]
        self.count += 1
        self.wait_s += (job.submitted - before.ended) + (job.started - job.submitted)
        self.held_s += (min(work) if work else job.started) - job.started


def run_terms(
    segments: Sequence[SegmentSummary], spans: Sequence[Span], *, mtbf_s: float, hang_share: float
) -> RunTerms:
    """The campaign's terms over `segments` (each with its measured goodput) from rank 0's spans."""
    measured = [s for s in segments if s.goodput is not None]
    total = {k: sum(s.goodput.seconds[k] for s in measured) for k in measured[0].goodput.seconds}
    restarts, saves, steps, failed, hangs = Restarts(), [], 0, 0, 0
    for s in measured:
        jobs = s.goodput.jobs
        mine = [p for p in spans if p.segment == s.segment and jobs[0].submitted <= p.started <= jobs[-1].ended]
        saves += [p.seconds for p in mine if p.kind == "save"]
        steps += len({p.step for p in mine if p.kind == "step"})
        for before, job in zip(jobs, jobs[1:]):
            if before.outcome not in NO_FAILURE:
                restarts.add(job, before, mine)
        failed += sum(j.outcome not in NO_FAILURE for j in jobs)
        hangs += sum(j.outcome == JobOutcome.HANG for j in jobs)
    lost = counted(total, Badput.LOST_WORK)
    restart = restarts.wait_s + restarts.held_s
    blocking = sum(saves) / len(saves) if saves else 0.0
    interval = measured[0].setup.checkpoint_interval.interval_steps
    written = [v.background_s for s in measured for v in s.saves if v.background_s is not None]
    seconds = {  # by trainflow.badput's categories: where each measured term counts but queue, start-up and load,
        # which count in restart after a failure (restarts) and in start-up otherwise (the rest of the wall time)
        Badput.CHECKPOINT.value: counted(total, Badput.CHECKPOINT),
        Badput.LOST_WORK.value: lost,
        Badput.DETECTION.value: counted(total, Badput.DETECTION),
        Badput.RESTART.value: restart,
        Badput.EVALUATION.value: counted(total, Badput.EVALUATION),
        "productive": total["productive"],
    }
    wall = sum(s.goodput.wall_s for s in measured)
    seconds |= {Badput.START_UP.value: max(0.0, wall - sum(seconds.values())), "wall": wall}
    return RunTerms(
        segments=len(measured),
        steps=steps,
        failures=failed,
        hangs=hangs,
        step_s=total["productive"] / steps if steps else 0.0,
        eval_share=total["evaluation"] / total["productive"] if total["productive"] else 0.0,
        interval_steps=interval,
        blocking_s=blocking,
        write_s=sum(written) / len(written) if written else 0.0,
        detect_s=total["detection"] / failed if failed else 0.0,
        wait_s=restarts.wait_s / restarts.count if restarts.count else 0.0,
        held_s=restarts.held_s / restarts.count if restarts.count else 0.0,
        starts_s=seconds[Badput.START_UP],
        boundary_saves_s=max(0.0, total["checkpoint"] - (math.ceil(steps / max(interval, 1)) - 1) * blocking),
        at_risk_s=sum(total[k] for k in ("productive", "evaluation", "checkpoint", "other")) + lost + restarts.held_s,
        mtbf_s=mtbf_s,
        hang_share=hang_share,
        measured=seconds,
    )


def counted(total: dict[str, float], category: Badput) -> float:
    """The measured seconds (resilience.goodput's terms) that count in `category` (trainflow.badput.MEASURED)."""
    return sum(total[term] for term, counts in MEASURED.items() if counts is category)


def write_terms(cfg: TrainflowConfig, summary: SegmentSummary) -> RunTerms:
    """The series' terms up to this segment (`summary`, the segments before it as they were kept: train.kept), written
    to terms.json."""
    folder = RunFolder.of(cfg)
    kept = (RunFolder.kept_summary(cfg.io.checkpoints, i) for i in range(cfg.segment))
    earlier = [read_record(SegmentSummary, path, rerun="train_segment") for path in kept if Path(path).is_file()]
    spans = Journal(RunFolder.spans_log(cfg.io.checkpoints), Span).read()
    h = cfg.cluster.hardware
    terms = run_terms([*earlier, summary], spans, mtbf_s=cfg.fault.mtbf_s, hang_share=h.hang_share)
    write_text_atomic(folder.run_terms, json.dumps(terms.to_json(), indent=1) + "\n")
    return terms
