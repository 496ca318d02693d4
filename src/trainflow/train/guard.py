"""The loss-spike guard: every step's loss and gradient norm are judged before the optimizer applies them.

    guard = LossGuard(cfg.train.spike)
    reason = guard.judge(step, window, loss, grad_norm)   # None: apply the step; else why it is not applied
    if guard.rollback_due: ...                   # train.spike.rollback_after bad steps in a row

A step is bad when its loss or gradient norm is not finite, or when its loss exceeds the mean of the last
train.spike.window applied losses by more than train.spike.factor standard deviations (judged once the window is
full: early training falls too fast for a running statistic). A bad step is not applied: its gradients are dropped,
as Megatron's skipped iterations are, and the step still counts (its data window and learning rate are spent). After
rollback_after bad steps in a row the trainer reloads the newest verified checkpoint from before the first of them
and leaves their data windows (each a step's [start, end) of global sample positions) out of the stream for good
(data.stream.DataStream.skip): the stream then runs on past them. The skipped windows (the stream's position) and the
loss window (GuardState) are saved in every checkpoint's manifest, so a run resumed from it judges and draws exactly
as the uninterrupted run.
The loss and gradient norm every rank judges are the global ones (all-reduced), so every rank decides the same.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from trainflow.checkpoint.manifest import GuardState, Manifest
from trainflow.config.schema import SpikeConfig
from trainflow.errors import TrainflowError
from trainflow.records import Record


class DivergenceError(TrainflowError):
    """Bad steps in a row with no checkpoint from before them to roll back to."""


def window_ranges(data: dict) -> dict:
    """Format 1 -> 2: a guard event's data windows were window numbers (one step's batch each), now [start, end)
    ranges of global sample positions; an old event keeps its numbers as one-wide ranges of unit `windows`."""
    return {**data, "windows": [[w, w + 1] for w in data["windows"]], "unit": "windows"}


@dataclass(frozen=True)
class GuardEvent(Record):
    """A step the guard did not apply, or a rollback: one line of the report each."""

    FORMAT = 2
    MIGRATIONS = {1: window_ranges}

    step: int
    """The step skipped; for a rollback, the checkpoint's step it went back to (a resume from there redoes it)."""
    action: str
    """skipped or rolled back."""
    reason: str
    windows: list[list[int]]
    """The data windows the step drew (skipped) or that the rollback left out of the stream for good: [start, end) of
    global sample positions (data.stream)."""
    from_step: int = -1
    """A rollback: the step after which it was triggered."""
    unit: str = "samples"
    """What `windows` count: samples; `windows` for an event from format 1 (window numbers, one step's batch each)."""

    def spans(self) -> str:
        if self.unit == "windows":
            return "data window " + ", ".join(str(a) for a, _ in self.windows)
        return "samples " + ", ".join(f"{a}-{b - 1}" for a, b in self.windows)

    def line(self) -> str:
        if self.action == "skipped":
            return f"step {self.step}: not applied ({self.reason}; {self.spans()})"
        return f"step {self.from_step}: rolled back to step {self.step} ({self.reason}); skipped {self.spans()}"


class LossGuard:
    def __init__(self, spike: SpikeConfig) -> None:
        self.spike = spike
        self.losses: deque[float] = deque(maxlen=spike.window)
        self.bad: list[tuple[int, list[int], str]] = []
        """The current run of bad steps: (step, its data window [start, end), reason)."""

    def judge(self, step: int, window: list[int], loss: float, grad_norm: float) -> str | None:
        """Record the step; None when it may be applied, else why not."""
        reason = self.why_bad(loss, grad_norm)
        if reason is None:
            self.losses.append(loss)
            self.bad.clear()
        else:
            self.bad.append((step, window, reason))
        return reason

    def why_bad(self, loss: float, grad_norm: float) -> str | None:
        if not math.isfinite(loss):
            return f"loss {loss}"
        if not math.isfinite(grad_norm):
            return f"gradient norm {grad_norm}"
        if len(self.losses) == self.spike.window:
            mean, sd = statistics.fmean(self.losses), statistics.pstdev(self.losses)
            if loss > mean + self.spike.factor * sd:
                return (
                    f"loss {loss:.4f} > {mean:.4f} + {self.spike.factor:g} x {sd:.4f}, the mean and deviation of the "
                    f"last {self.spike.window} applied steps"
                )
        return None

    @property
    def rollback_due(self) -> bool:
        return len(self.bad) >= self.spike.rollback_after

    @property
    def first_bad(self) -> int:
        return self.bad[0][0]

    def rolled_back(self, to_step: int) -> GuardEvent:
        """After the trainer reloaded the checkpoint of `to_step`: the event, whose windows the trainer leaves out of
        the stream for good, restoring the guard from the checkpoint (train.checkpointing)."""
        reasons = "; ".join(f"step {step}: {reason}" for step, _, reason in self.bad)
        event = GuardEvent(
            step=to_step,
            action="rolled back",
            reason=f"{len(self.bad)} bad steps in a row: {reasons}",
            windows=[window for _, window, _ in self.bad],
            from_step=self.bad[-1][0],
        )
        self.bad = []
        return event

    def skip_event(self) -> GuardEvent:
        step, window, reason = self.bad[-1]
        return GuardEvent(step=step, action="skipped", reason=reason, windows=[window])

    def state(self) -> GuardState:
        return GuardState(losses=list(self.losses))

    def restore(self, state: GuardState) -> None:
        self.bad = []
        self.losses = deque(state.losses[-self.spike.window :], maxlen=self.spike.window)


def read_guard_state(manifest: Manifest) -> GuardState:
    """The guard state a checkpoint's manifest holds (checked as the manifest was read: checkpoint.manifest's
    GuardState); a manifest from before the guard holds none: empty."""
    return manifest.guard if manifest.guard is not None else GuardState(losses=[])
