"""Training metrics as TensorBoard event files, where torchtitan and Megatron users look first (a Tracker).

    tensorboard --logdir runs/default/train

Rank 0 writes one event file per segment run (observe.tensorboard) under the run's train folder, every scalar of
trainflow.train.trackers at the step it describes. A rerun of a segment adds a file; TensorBoard shows the newest
value of a step.
"""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from trainflow.train.trackers import Tracker


class TensorBoardLog(Tracker):
    def __init__(self, folder: str | Path) -> None:
        self.writer = SummaryWriter(str(folder))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()
