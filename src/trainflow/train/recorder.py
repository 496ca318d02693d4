"""What a segment records about itself on rank 0, step by step: the step and evaluation logs beside the checkpoints,
the trackers (TensorBoard, W&B, MLflow), the progress lines; and the profiler every rank runs.

    recorder = StepRecorder(cfg, rank=rank, device=device, span=span)
    recorder.resume(step)          # drop the records of the steps this run redoes
    recorder.changes(step, changed)   # the settings this job changed against its checkpoint (the lineage)
    recorder.step(record) ...      # after each step; recorder.evaluation(step, val_loss, started, seconds, sources=...)
    recorder.span("save", step, started, seconds)   # where else the job's time went (the measured goodput)
"""

from __future__ import annotations

import logging
from pathlib import Path
from statistics import median
from typing import Any

import torch
import torch.distributed as dist

from trainflow.atomic import write_json
from trainflow.campaign.records import StepChange
from trainflow.campaign.segments import SegmentSpan
from trainflow.config import TrainflowConfig, as_dict
from trainflow.config.identity import Change
from trainflow.config.run_folder import RunFolder
from trainflow.host import hostname
from trainflow.journal import Journal
from trainflow.progress import Progress
from trainflow.resilience.goodput import Span
from trainflow.resilience.timing import RankTiming
from trainflow.train.guard import GuardEvent
from trainflow.train.profile import StepProfiler
from trainflow.train.run_record import RunRecord
from trainflow.train.run_trackers import mlflow_tracker, wandb_tracker
from trainflow.train.step_log import EvalRecord, StepRecord
from trainflow.train.summary import ProfileSummary
from trainflow.train.trackers import Tracker

log = logging.getLogger(__name__)


class StepRecorder:
    def __init__(self, cfg: TrainflowConfig, *, rank: int, device: torch.device, span: SegmentSpan) -> None:
        self.cfg, self.is_logger = cfg, rank == 0
        o, run = cfg.observe, RunFolder.of(cfg)
        self.start_step, self.end_step = span.start, span.end
        self.steps_log = Journal(RunFolder.steps_log(cfg.io.checkpoints), StepRecord)
        self.evals_log = Journal(RunFolder.evals_log(cfg.io.checkpoints), EvalRecord)
        self.guard_log = Journal(RunFolder.guard_log(cfg.io.checkpoints), GuardEvent)
        self.spans_log = Journal(RunFolder.spans_log(cfg.io.checkpoints), Span)
        if self.is_logger:
            write_json(run.run_record, RunRecord.of(cfg, span).to_json())  # trainflow.status's entry to the run folder
        self.trackers = build_trackers(cfg, is_logger=self.is_logger)
        profile = Path(run.profile(cfg.segment)) if o.profile else None
        self.profiler = StepProfiler(profile, rank=rank, steps=o.profile_steps, device=device)
        self.progress = Progress(log, "Trained", span.end - span.start, unit="steps", every_s=10.0)
        self.rank, self.forward_s = rank, []
        """This rank's forward seconds of each step: every rank keeps its own (the stragglers)."""

    def resume(self, step: int) -> None:
        """Drop the records of the steps a run resumed from `step` redoes (they belong to work the checkpoint does
        not contain): steps and guard events record the step they started from, evaluations the step they ended at."""
        if self.is_logger:
            self.steps_log.drop(step, self.end_step - 1)
            self.evals_log.drop(step + 1 if step else 0, self.end_step)
            self.guard_log.drop(step, self.end_step - 1)

    def changes(self, step: int, changes: list[Change]) -> None:
        """The settings this job changed against the checkpoint of `step` it resumed from (changes.jsonl)."""
        if self.is_logger and changes:
            journal = Journal(RunFolder.changes_log(self.cfg.io.checkpoints), StepChange)
            for change in changes:
                journal.append(StepChange(step, self.cfg.segment, change))
            log.info("Changed from step %d: %s", step, "; ".join(c.line() for c in changes))

    def span(self, kind: str, step: int, started: float, seconds: float) -> None:
        if self.is_logger:
            self.spans_log.append(Span(self.cfg.segment, kind, step, started, seconds))

    def guard(self, event: GuardEvent) -> None:
        if self.is_logger:
            self.guard_log.append(event)
            log.warning("Loss guard: %s", event.line())

    def step(self, record: StepRecord) -> None:
        self.profiler.step()
        self.forward_s.append(record.forward_s)
        if not self.is_logger:
            return
        self.steps_log.append(record)
        self.span("skipped" if record.skipped else "step", record.step, record.started, record.step_s)
        for tracker in self.trackers:
            tracker.step(record)
        done = record.step + 1
        if done % self.cfg.train.log_every == 0 or done == self.end_step:
            log.info(
                "step %d loss %.4f lr %.2e grad_norm %.3f %.0f tokens/s",
                *(done, record.loss, record.lr, record.grad_norm, record.tokens_per_s),
            )
            self.progress.update(done - self.start_step)

    def evaluation(
        self, step: int, val_loss: float, started: float, seconds: float, *, sources: dict[str, float]
    ) -> None:
        """`val_loss` is the sources' weighted mean, `sources` each source's loss."""
        if self.is_logger:
            self.evals_log.append(EvalRecord(step=step, val_loss=val_loss, sources=sources))
            self.span("eval", step, started, seconds)
            for tracker in self.trackers:
                tracker.evaluation(step, val_loss, sources)
            each = f" ({', '.join(f'{k} {v:.4f}' for k, v in sources.items())})" if len(sources) > 1 else ""
            log.info("Evaluated step %d: validation loss %.4f%s", step, val_loss, each)

    def steps(self) -> list[StepRecord]:
        """The segment's step records (rank 0's; the other ranks keep none)."""
        return self.steps_log.between(self.start_step, self.end_step - 1) if self.is_logger else []

    def evals(self) -> list[EvalRecord]:
        return self.evals_log.between(self.start_step, self.end_step) if self.is_logger else []

    def guard_events(self) -> list[GuardEvent]:
        return self.guard_log.between(self.start_step, self.end_step - 1) if self.is_logger else []

    def rank_timings(self) -> list[RankTiming]:
        """Every rank's median forward per step, gathered on rank 0 (a collective; the others return none)."""
        times = self.forward_s[1:] or self.forward_s  # the first step warms up
        mine = RankTiming(self.rank, hostname(), median(times) if times else float("nan"), len(self.forward_s))
        timings: list | None = [None] * dist.get_world_size() if self.is_logger else None
        dist.gather_object(mine, timings, dst=0)
        return timings or []

    def close(self) -> ProfileSummary | None:
        """Close the trackers and the profiler (writing its trace if the segment ended inside its steps)."""
        for tracker in self.trackers:
            tracker.close()
        return self.profiler.close()


def campaign(cfg: TrainflowConfig) -> dict[str, Any]:
    """What W&B and MLflow name a run by: the run's name, the campaign's id and the whole resolved config."""
    return {"name": cfg.run, "id": RunFolder.of(cfg).series, "config": as_dict(cfg)}


def build_trackers(cfg: TrainflowConfig, *, is_logger: bool) -> list[Tracker]:
    """The trackers observe.* turns on, on rank 0 (the others log nothing)."""
    if not is_logger:
        return []
    o, run, trackers = cfg.observe, RunFolder.of(cfg), []
    if o.tensorboard:
        from trainflow.train.tensorboard import TensorBoardLog

        trackers.append(TensorBoardLog(run.tensorboard))
    if o.wandb.enabled:
        trackers.append(wandb_tracker(o.wandb, run, **campaign(cfg)))
    if o.mlflow.enabled:
        trackers.append(mlflow_tracker(o.mlflow, run, **campaign(cfg)))
    return trackers
