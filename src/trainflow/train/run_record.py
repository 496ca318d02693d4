"""What a campaign is, for whoever reads its run folder without its config (trainflow.status; the trackers' run id):
train/<series>/run.json, rewritten by rank 0 at the start of each training job. Nothing here imports torch.

    python -c "from trainflow.records import read_record; from trainflow.train.run_record import RunRecord; \
        print(read_record(RunRecord, 'runs/default/train/<series>/run.json').total_steps)"
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from trainflow.campaign.segments import SegmentSpan
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.records import Record


def series_and_plan(data: dict) -> dict:
    """Format 1 -> 2: train_hash is the series' name, and the planned steps are recorded (they were segments x
    segment_steps, before a campaign's segments could change length)."""
    data = dict(data)
    data["series"] = data.pop("train_hash")
    return {**data, "total_steps": data["segments"] * data["segment_steps"]}


@dataclass(frozen=True)
class RunRecord(Record):
    FORMAT = 2
    MIGRATIONS = {1: series_and_plan}

    run: str
    series: str
    """The checkpoint series (RunFolder.series), and the trackers' run id."""
    segments: int
    segment_steps: int
    total_steps: int
    """The series' planned last step (campaign.segments.SegmentSpan.horizon of the segment that wrote it)."""
    tokens_per_step: int
    """train.global_batch x model.seq_len."""
    world_size: int
    checkpoints: str
    """io.checkpoints: relative to the run folder (storage.root) when it lies inside it, else absolute."""
    segment: int
    """The segment of the job that wrote it last."""
    written: float
    """Wall-clock time (time.time()) it was written."""

    @classmethod
    def of(cls, cfg: TrainflowConfig, span: SegmentSpan) -> RunRecord:
        root, checkpoints = os.path.abspath(cfg.storage.root), os.path.abspath(cfg.io.checkpoints)
        inside = os.path.commonpath([root, checkpoints]) == root
        return cls(
            run=cfg.run,
            series=RunFolder.of(cfg).series,
            segments=cfg.train.segments,
            segment_steps=cfg.train.segment_steps,
            total_steps=span.horizon,
            tokens_per_step=cfg.train.global_batch * cfg.model.seq_len,
            world_size=cfg.parallel.world_size,
            checkpoints=os.path.relpath(checkpoints, root) if inside else checkpoints,
            segment=cfg.segment,
            written=time.time(),
        )
