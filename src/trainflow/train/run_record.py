"""What a campaign is, for whoever reads its run folder without its config (trainflow.status; the trackers' run id):
train/<hash>/run.json, rewritten by rank 0 at the start of each training job. Nothing here imports torch.

    python -c "from trainflow.records import read_record; from trainflow.train.run_record import RunRecord; \
        print(read_record(RunRecord, 'runs/default/train/<hash>/run.json').total_steps)"
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.records import Record


@dataclass(frozen=True)
class RunRecord(Record):
    run: str
    train_hash: str
    """The hash of what training reads (RunFolder.train_hash): the checkpoint series', and the trackers' run id."""
    segments: int
    segment_steps: int
    tokens_per_step: int
    """train.global_batch x model.seq_len."""
    world_size: int
    checkpoints: str
    """io.checkpoints: relative to the run folder (storage.root) when it lies inside it, else absolute."""
    segment: int
    """The segment of the job that wrote it last."""
    written: float
    """Wall-clock time (time.time()) it was written."""

    @property
    def total_steps(self) -> int:
        return self.segments * self.segment_steps

    @classmethod
    def of(cls, cfg: TrainflowConfig) -> RunRecord:
        root, checkpoints = os.path.abspath(cfg.storage.root), os.path.abspath(cfg.io.checkpoints)
        inside = os.path.commonpath([root, checkpoints]) == root
        return cls(
            run=cfg.run,
            train_hash=RunFolder.of(cfg).train_hash,
            segments=cfg.train.segments,
            segment_steps=cfg.train.segment_steps,
            tokens_per_step=cfg.train.global_batch * cfg.model.seq_len,
            world_size=cfg.parallel.world_size,
            checkpoints=os.path.relpath(checkpoints, root) if inside else checkpoints,
            segment=cfg.segment,
            written=time.time(),
        )
