"""The learning-rate schedule as a record a checkpoint carries: linear warmup, then cosine decay from an anchor to
lr x min_lr_ratio at the series' planned last step (its horizon), or, with optim.schedule=wsd (warmup-stable-decay),
lr held constant, then a decay from an anchor to the same end over the last optim.decay_steps steps. Torch-free.

    python -c "from trainflow.config import compose; from trainflow.config.schedule import Schedule; \
        print(Schedule.of(compose('train_segment').optim, horizon=300).lr_at(100))"

A campaign's plan changes under way: extended by segments, its segments lengthened, its learning rate lowered. Each
checkpoint records the schedule that trained it, and the next segment reconciles it with the config (Schedule.
resumed): the same settings and horizon go on as they were; a new horizon alone re-anchors the decay at the segment's
first step, from the learning rate that step had, so the curve bends without a jump; new optim settings (lr,
min_lr_ratio, warmup_steps, schedule, decay_steps, decay_shape) are followed from that step, a jump the operator asked
for. Either is one of the segment's changes in its lineage. An unchanged schedule computes every step's learning rate
bit for bit as the plain formula.

wsd is for a campaign whose length is not known when it starts (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training Beyond Fixed Training Durations"): the stable part's learning rate depends on no horizon, so a new horizon
before the decay has begun only moves the decay, and no trained step's learning rate changes. The decay is usually a
phase of its own, whose optim.decay_steps is the phase's length: a new setting at the stable checkpoint it starts
from, so the decay runs from there, from lr, to the phase's end. A new horizon once the decay has begun re-anchors it
as cosine's: from the learning rate its step had to the same end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from trainflow.config.schema import DecayShape, LrSchedule, OptimConfig
from trainflow.records import Record

DECAYS: dict[str, Callable[[float], float]] = {
    LrSchedule.COSINE: lambda p: 0.5 * (1 + math.cos(math.pi * p)),
    DecayShape.LINEAR: lambda p: 1 - p,
    DecayShape.SQRT: lambda p: 1 - math.sqrt(p),
}
"""A decay's fraction left at progress p (0 to 1): cosine's, and wsd's shapes."""


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
    """Where the decay starts: warmup's end (cosine), horizon - decay_steps (wsd), or the step a new horizon
    re-anchored it at."""
    anchor_lr: float
    """The learning rate at anchor_step."""
    end_ratio: float
    """The decay's end over anchor_lr (min_lr_ratio until a re-anchor)."""
    kind: LrSchedule = LrSchedule.COSINE
    """optim.schedule (a manifest before wsd holds none: it was cosine)."""
    decay_steps: int = 0
    """optim.decay_steps: wsd's decay length; 0: no decay, lr stays constant after warmup."""
    decay_shape: DecayShape = DecayShape.SQRT
    """optim.decay_shape: how wsd's decay falls (cosine's is cosine whatever it says)."""

    @classmethod
    def of(cls, optim: OptimConfig, *, horizon: int) -> Schedule:
        """The plain schedule of `optim` over `horizon` steps."""
        o, kind = optim, LrSchedule(optim.schedule)
        start = max(horizon - o.decay_steps, o.warmup_steps) if kind == LrSchedule.WSD else o.warmup_steps
        shape = DecayShape(o.decay_shape)
        return cls(
            o.lr, o.min_lr_ratio, o.warmup_steps, horizon, start, o.lr, o.min_lr_ratio, kind, o.decay_steps, shape
        )

    def lr_at(self, step: int) -> float:
        """The learning rate of `step`, from anchor_step on (a re-anchored schedule is not asked for steps before)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.kind == LrSchedule.WSD and (step < self.anchor_step or not self.decay_steps):
            return self.lr  # the stable part
        progress = max((step - self.anchor_step) / max(self.horizon - self.anchor_step, 1), 0.0)
        r, decay = self.end_ratio, DECAYS[self.decay_shape if self.kind == LrSchedule.WSD else self.kind]
        # cosine's is the plain formula's expression, its (exact) halving moved inside the lambda: the same bits
        return self.anchor_lr * (r + (1 - r) * decay(min(progress, 1.0)))

    def same_settings(self, optim: OptimConfig) -> bool:
        """Whether `optim` asks for this schedule's settings; its decay_shape only under wsd (cosine has none)."""
        mine = (self.lr, self.min_lr_ratio, self.warmup_steps, self.kind, self.decay_steps)
        theirs = (optim.lr, optim.min_lr_ratio, optim.warmup_steps, optim.schedule, optim.decay_steps)
        return mine == theirs and (self.kind == LrSchedule.COSINE or self.decay_shape == optim.decay_shape)

    def resumed(self, optim: OptimConfig, *, horizon: int, at: int) -> Schedule:
        """The schedule from step `at` on, for `optim` and the plan's `horizon` (module docstring)."""
        if not self.same_settings(optim):
            return Schedule.of(optim, horizon=horizon)
        if horizon == self.horizon:
            return self
        if self.kind == LrSchedule.WSD:
            new, plain = Schedule.of(optim, horizon=horizon), self == Schedule.of(optim, horizon=self.horizon)
            if not self.decay_steps or (plain and at <= min(self.anchor_step, new.anchor_step)):
                return new  # no decay has begun by `at`, in either: every step before it was warmup or stable in both
        elif at <= self.warmup_steps:  # the decay has not begun: only where it ends moves
            return replace(self, horizon=horizon)
        lr = self.lr_at(at)
        end = self.lr * self.min_lr_ratio / lr if lr > 0 else 1.0
        return replace(self, horizon=horizon, anchor_step=at, anchor_lr=lr, end_ratio=min(end, 1.0))

    def line(self) -> str:
        """`cosine from 0.003 at step 20 to 0.0003 at step 300 (peak 0.003, warmup 20)`, `wsd: warmup 20, stable 0.003
        to step 1200, 1-sqrt decay to 0.0003 at step 1500`: what the lineage compares (train.resume.SCHEDULE)."""
        end = self.anchor_lr * self.end_ratio
        if self.kind == LrSchedule.COSINE:
            return (
                f"cosine from {self.anchor_lr:.3g} at step {self.anchor_step} to {end:.3g} at step {self.horizon} "
                f"(peak {self.lr:.3g}, warmup {self.warmup_steps})"
            )
        head = f"wsd: warmup {self.warmup_steps}, "
        if not self.decay_steps:  # no horizon in it: extending a stable run changes no learning rate
            return f"{head}stable {self.lr:.3g}, no decay"
        if self.anchor_lr == self.lr:
            decay = f"stable {self.lr:.3g} to step {self.anchor_step}, {self.decay_shape} decay"
        else:
            decay = f"peak {self.lr:.3g}, {self.decay_shape} decay from {self.anchor_lr:.3g} at step {self.anchor_step}"
        return f"{head}{decay} to {end:.3g} at step {self.horizon}"
