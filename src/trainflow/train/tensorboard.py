"""Training metrics as TensorBoard event files, where torchtitan and Megatron users look first.

    tensorboard --logdir runs/default/train

Rank 0 writes one event file per segment run (observe.tensorboard) under the run's train folder: every
number of a step record (loss, lr, grad_norm, tokens_per_s, mfu, the step split in seconds, memory) as
`train/<key>` and every evaluation as `eval/val_loss`, at the step it describes. A rerun of a segment
adds a file; TensorBoard shows the newest value of a step.
"""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from trainflow.train.step_log import StepRecord


class TensorBoardLog:
    def __init__(self, folder: str | Path | None) -> None:
        """folder None: write nothing (other ranks, or observe.tensorboard=false)."""
        self.writer = SummaryWriter(str(folder)) if folder is not None else None

    def step(self, record: StepRecord) -> None:
        if self.writer is None:
            return
        for key, value in record.to_json().items():
            if key not in ("step", "started", "skipped"):  # started: a wall-clock time; skipped: the guard's reason
                self.writer.add_scalar(f"train/{key}", value, record.step)
        self.writer.add_scalar("train/applied", float(record.skipped is None), record.step)

    def evaluation(self, step: int, val_loss: float, sources: dict[str, float]) -> None:
        """The weighted validation loss, and each source's as eval/val_loss/<source> (a mixture's only)."""
        if self.writer is None:
            return
        self.writer.add_scalar("eval/val_loss", val_loss, step)
        for name, loss in sources.items() if len(sources) > 1 else ():
            self.writer.add_scalar(f"eval/val_loss/{name}", loss, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
