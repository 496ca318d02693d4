"""When to checkpoint: Young/Daly's optimum from measured save and step times.

    interval = sqrt(2 * save time * MTBF)                 (Young 1974, Daly 2006)

Seed example: save 120 s, MTBF 4 h -> sqrt(2 * 120 * 14400) = 1859 s = 31 min, i.e. 250 steps at
7.44 s/step. Both times are measured in this run and re-planned as measurements arrive: the save
time as a running mean of the saves so far, the step time as a running mean of recent steps.

The save time is the time training is *blocked* by a save: all of it in sync mode, the staging and the
boundary's agreements in async mode (checkpoint.background), where the write itself runs beside training. An
async interval is never shorter than the background write (one save in flight at a time: a save due sooner would
only wait for the last). Every rank must plan the same interval (they save at the same steps), so the planner
plans from what a save reports, which is rank 0's measurement on every rank (SaveDone.step_s included), never from
a rank's own step times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainflow.records import Record

if TYPE_CHECKING:
    from trainflow.config import TrainflowConfig


def young_daly_seconds(*, save_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * save_s * mtbf_s)


def young_daly_steps(*, save_s: float, mtbf_s: float, step_s: float) -> int:
    return max(1, round(young_daly_seconds(save_s=save_s, mtbf_s=mtbf_s) / step_s))


def async_interval_steps(*, blocking_s: float, background_s: float, mtbf_s: float, step_s: float) -> int:
    """Young/Daly on the blocking time, but no shorter than the background write."""
    return max(young_daly_steps(save_s=blocking_s, mtbf_s=mtbf_s, step_s=step_s), math.ceil(background_s / step_s))


NO_HANGS = 1e-6
"""The hang share a share of 0 counts as in file_system_mtbf_s (a finite MTBF: Young/Daly's interval stays a number)."""


def file_system_mtbf_s(cfg: TrainflowConfig) -> float:
    """The mean time between the failures that need a file-system checkpoint, Young/Daly's input: all of them, or
    under resilience.recovery=peers only those that go the job path, the hangs (cluster.hardware.hang_share; the
    others resume from live replicas or peer snapshots: launch.peers). A hang share of 0 counts as NO_HANGS: the
    interval then reaches checkpoint.max_interval_steps. The planner (plan.campaign) and the trainer's
    IntervalPlanner (train.checkpointing) both take it."""
    h = cfg.cluster.hardware
    if cfg.resilience.recovery != "peers":
        return h.mtbf_hours * 3600
    return h.mtbf_hours * 3600 / max(h.hang_share, NO_HANGS)


@dataclass(frozen=True)
class SaveDone:
    """A save once durable (in sync mode, at once), the same on every rank (rank 0's measurements): what the trainer
    records of it (train.summary.SaveRecord) and Young/Daly plans from."""

    step: int
    started: float
    """Wall-clock time the save began."""
    blocking_s: float
    """Seconds training stood still for it: the whole save in sync mode; in async mode the staging, each step
    boundary's agreement while it was in flight and the commit's hand-off."""
    step_s: float
    """Rank 0's mean step time when the save began (what Young/Daly converts seconds to steps with)."""
    background_s: float | None = None
    """Async: the slowest rank's background copy and write, plus rank 0's manifest and rename; None in sync mode."""
    waited_s: float = 0.0
    """Seconds a later save, a stop signal or the segment's end waited for it to finish."""
    overlap_steps: int = 0
    """Steps that ran while it was in the background: steps `step` to `step + overlap_steps - 1`."""


@dataclass
class IntervalPlanner:
    mtbf_s: float
    fixed_steps: int = 0
    """A configured interval (checkpoint.interval_steps); 0 = Young/Daly."""
    max_steps: int = 1000
    first_after: int = 5
    """With no save measured yet, save after this many steps to measure one."""
    save_times: list[float] = field(default_factory=list)
    background_times: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    """This rank's recent steps: what the next save reports as step_s on rank 0."""
    planned_step_s: float = float("nan")
    """The step time the last save reported (rank 0's on every rank): the one the interval converts with."""

    def observe_step(self, seconds: float) -> None:
        self.step_times = (self.step_times + [seconds])[-50:]

    def observe_save(
        self, blocking_s: float, *, step_s: float | None = None, background_s: float | None = None
    ) -> None:
        """A save's blocking time, with the step time to plan by (default: this rank's own) and, in async mode, its
        background time."""
        self.save_times.append(blocking_s)
        if background_s is not None:
            self.background_times.append(background_s)
        self.planned_step_s = self.step_s if step_s is None else step_s

    @property
    def interval_steps(self) -> int:
        if self.fixed_steps:
            return self.fixed_steps
        mtbf_s, step_s = self.mtbf_s, self.planned_step_s
        if not self.save_times or math.isnan(step_s):  # no save yet, or none after a step (a phase's opening save)
            return self.first_after
        if self.background_s is None:
            steps = young_daly_steps(save_s=self.save_s, mtbf_s=mtbf_s, step_s=step_s)
        else:
            steps = async_interval_steps(
                blocking_s=self.save_s, background_s=self.background_s, mtbf_s=mtbf_s, step_s=step_s
            )
        return min(self.max_steps, steps)

    @property
    def save_s(self) -> float:
        """Mean blocking time of the saves so far (NaN before the first)."""
        return sum(self.save_times) / len(self.save_times) if self.save_times else float("nan")

    @property
    def background_s(self) -> float | None:
        """Mean background time of the async saves so far; None in sync mode."""
        return sum(self.background_times) / len(self.background_times) if self.background_times else None

    @property
    def step_s(self) -> float:
        """This rank's mean recent step (NaN before the first)."""
        return sum(self.step_times) / len(self.step_times) if self.step_times else float("nan")

    def due(self, steps_since_save: int) -> bool:
        return steps_since_save >= self.interval_steps

    def describe(self) -> IntervalPlan:
        young_daly = (
            None
            if self.fixed_steps or not self.save_times
            else young_daly_seconds(save_s=self.save_s, mtbf_s=self.mtbf_s)
        )
        return IntervalPlan(
            policy="fixed" if self.fixed_steps else "young_daly",
            interval_steps=self.interval_steps,
            save_s=self.save_s,
            step_s=self.planned_step_s if self.save_times else self.step_s,
            mtbf_s=self.mtbf_s,
            interval_s=young_daly,
            background_s=self.background_s,
        )


@dataclass(frozen=True)
class IntervalPlan(Record):
    """The interval a segment saved at, and the measurements it came from."""

    policy: str
    """young_daly, or fixed (checkpoint.interval_steps)."""
    interval_steps: int
    save_s: float
    """Mean measured blocking time of a save (NaN before the first)."""
    step_s: float
    mtbf_s: float
    interval_s: float | None
    """sqrt(2 x save x MTBF); None under a fixed interval or before the first save."""
    background_s: float | None = None
    """Mean background write of the async saves (the interval's floor); None in sync mode."""
