"""When to checkpoint: Young/Daly's optimum from measured save and step times.

    interval = sqrt(2 * save time * MTBF)                 (Young 1974, Daly 2006)

Seed example: save 120 s, MTBF 4 h -> sqrt(2 * 120 * 14400) = 1859 s = 31 min, i.e. 250 steps at
7.44 s/step. Both times are measured in this run and re-planned as measurements arrive: the save
time as a running mean of the saves so far, the step time as a running mean of recent steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainflow.records import Record


def young_daly_seconds(*, save_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * save_s * mtbf_s)


def young_daly_steps(*, save_s: float, mtbf_s: float, step_s: float) -> int:
    return max(1, round(young_daly_seconds(save_s=save_s, mtbf_s=mtbf_s) / step_s))


@dataclass
class IntervalPlanner:
    mtbf_s: float
    fixed_steps: int = 0
    """A configured interval (checkpoint.interval_steps); 0 = Young/Daly."""
    max_steps: int = 1000
    first_after: int = 5
    """With no save measured yet, save after this many steps to measure one."""
    save_times: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)

    def observe_step(self, seconds: float) -> None:
        self.step_times = (self.step_times + [seconds])[-50:]

    def observe_save(self, seconds: float) -> None:
        self.save_times.append(seconds)

    @property
    def interval_steps(self) -> int:
        if self.fixed_steps:
            return self.fixed_steps
        if not self.save_times or not self.step_times:
            return self.first_after
        return min(self.max_steps, young_daly_steps(save_s=self.save_s, mtbf_s=self.mtbf_s, step_s=self.step_s))

    @property
    def save_s(self) -> float:
        return sum(self.save_times) / len(self.save_times) if self.save_times else float("nan")

    @property
    def step_s(self) -> float:
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
            step_s=self.step_s,
            mtbf_s=self.mtbf_s,
            interval_s=young_daly,
        )


@dataclass(frozen=True)
class IntervalPlan(Record):
    """The interval a segment saved at, and the measurements it came from."""

    policy: str
    """young_daly, or fixed (checkpoint.interval_steps)."""
    interval_steps: int
    save_s: float
    """Mean measured save (NaN before the first)."""
    step_s: float
    mtbf_s: float
    interval_s: float | None
    """sqrt(2 x save x MTBF); None under a fixed interval or before the first save."""
