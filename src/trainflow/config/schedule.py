"""The learning-rate schedule as a record a checkpoint carries: linear warmup, then cosine decay from an anchor to
lr x min_lr_ratio at the series' planned last step (its horizon). Torch-free.

    python -c "from trainflow.config import compose; from trainflow.config.schedule import Schedule; \
        print(Schedule.of(compose('train_segment').optim, horizon=300).lr_at(100))"

A campaign's plan changes under way: extended by segments, its segments lengthened, its learning rate lowered. Each
checkpoint records the schedule that trained it, and the next segment reconciles it with the config (Schedule.
resumed): the same settings and horizon go on as they were; a new horizon alone re-anchors the decay at the segment's
first step, from the learning rate that step had, so the curve bends without a jump; new optim settings (lr,
min_lr_ratio, warmup_steps) are followed from that step, a jump the operator asked for. Either is one of the segment's
changes in its lineage. An unchanged schedule computes every step's learning rate bit for bit as the plain formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainflow.config.schema import OptimConfig
from trainflow.records import Record


@dataclass(frozen=True)
class Schedule(Record):
    lr: float
    """optim.lr: the peak, where warmup ends."""
    min_lr_ratio: float
    """optim.min_lr_ratio: the decay ends at lr x min_lr_ratio."""
    warmup_steps: int
    horizon: int
    """The step the decay ends at: the series' planned last step when the schedule was set."""
    anchor_step: int
    """Where the decay starts: warmup's end, or the step a new horizon re-anchored it at."""
    anchor_lr: float
    """The learning rate at anchor_step."""
    end_ratio: float
    """The decay's end over anchor_lr (min_lr_ratio until a re-anchor)."""

    @classmethod
    def of(cls, optim: OptimConfig, *, horizon: int) -> Schedule:
        """The plain schedule of `optim` over `horizon` steps."""
        o = optim
        return cls(o.lr, o.min_lr_ratio, o.warmup_steps, horizon, o.warmup_steps, o.lr, o.min_lr_ratio)

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = max((step - self.anchor_step) / max(self.horizon - self.anchor_step, 1), 0.0)
        r = self.end_ratio  # the expression of the plain formula, operation for operation: the same bits
        return self.anchor_lr * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))

    def same_settings(self, optim: OptimConfig) -> bool:
        return (self.lr, self.min_lr_ratio, self.warmup_steps) == (optim.lr, optim.min_lr_ratio, optim.warmup_steps)

    def resumed(self, optim: OptimConfig, *, horizon: int, at: int) -> Schedule:
        """The schedule from step `at` on, for `optim` and the plan's `horizon` (module docstring)."""
        if not self.same_settings(optim):
            return Schedule.of(optim, horizon=horizon)
        if horizon == self.horizon:
            return self
        if at <= self.warmup_steps:  # the decay has not begun: only where it ends moves
            return replace(self, horizon=horizon)
        lr = self.lr_at(at)
        end = self.lr * self.min_lr_ratio / lr if lr > 0 else 1.0
        return replace(self, horizon=horizon, anchor_step=at, anchor_lr=lr, end_ratio=min(end, 1.0))

    def line(self) -> str:
        """cosine from 3.0e-04 at step 0 to 3.0e-05 at step 300 (warmup 10)"""
        end = self.anchor_lr * self.end_ratio
        return (
            f"cosine from {self.anchor_lr:.3g} at step {self.anchor_step} to {end:.3g} at step {self.horizon} "
            f"(peak {self.lr:.3g}, warmup {self.warmup_steps})"
        )
