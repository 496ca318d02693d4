"""Each rank's own forward time and the stragglers among them: one measure (train.clock's median forward) that the
heartbeat's timing file carries for a restart (resilience.exclude_stragglers) and the segment's summary for
the report.

    python -c "from trainflow.resilience.timing import RankTiming, stragglers; \
        print(stragglers([RankTiming(0, 'a', 1.0, 9), RankTiming(1, 'b', 2.0, 9)], 1.5))"
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from trainflow.records import Record


@dataclass(frozen=True)
class RankTiming(Record):
    """One rank's own forward time per step (train.clock; every rank measures its own, rank 0's step records show
    only rank 0's)."""

    rank: int
    host: str
    forward_s: float
    """Median seconds of forward per step, the first (warm-up) step left out."""
    steps: int


def stragglers(timings: list[RankTiming], factor: float) -> list[RankTiming]:
    """The ranks whose median forward exceeds `factor` x the median over ranks (resilience.straggler_factor)."""
    measured = [t for t in timings if t.steps and t.forward_s == t.forward_s]  # NaN: a rank that ran no step
    if len(measured) < 2:
        return []
    typical = median(t.forward_s for t in measured)
    return [t for t in measured if t.forward_s > factor * typical]
