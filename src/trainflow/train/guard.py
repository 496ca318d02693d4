"""The loss-spike guard: every step's loss and gradient norm are judged before the optimizer applies them.

    guard = LossGuard(cfg.train.spike)
    window = guard.window(step)                  # the data window step `step` draws (skipped ones left out)
    reason = guard.judge(step, window, loss, grad_norm)   # None: apply the step; else why it is not applied
    if guard.rollback_due: ...                   # train.spike.rollback_after bad steps in a row

A step is bad when its loss or gradient norm is not finite, or when its loss exceeds the mean of the last
train.spike.window applied losses by more than train.spike.factor standard deviations (judged once the window is
full: early training falls too fast for a running statistic). A bad step is not applied: its gradients are dropped,
as Megatron's skipped iterations are, and the step still counts (its data window and learning rate are spent). After
rollback_after bad steps in a row the trainer reloads the newest verified checkpoint from before the first of them
and leaves their data windows out of the stream for good: the stream then runs on to the next window, so the batch
of a step is a pure function of (seed, step, skipped windows). The skipped windows and the loss window are saved in
every checkpoint's manifest (GuardState), so a run resumed from it judges and draws exactly as the uninterrupted run.
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


@dataclass(frozen=True)
class GuardEvent(Record):
    """A step the guard did not apply, or a rollback: one line of the report each."""

    step: int
    """The step skipped; for a rollback, the checkpoint's step it went back to (a resume from there redoes it)."""
    action: str
    """skipped or rolled back."""
    reason: str
    windows: list[int]
    """The data windows the step drew (skipped) or that the rollback left out of the stream for good."""
    from_step: int = -1
    """A rollback: the step after which it was triggered."""

    def line(self) -> str:
        if self.action == "skipped":
            return f"step {self.step}: not applied ({self.reason}; data window {self.windows[0]})"
        windows = ", ".join(map(str, self.windows))
        return f"step {self.from_step}: rolled back to step {self.step} ({self.reason}); skipped data windows {windows}"


class LossGuard:
    def __init__(self, spike: SpikeConfig) -> None:
        self.spike = spike
        self.losses: deque[float] = deque(maxlen=spike.window)
        self.skipped: list[int] = []
        self.bad: list[tuple[int, int, str]] = []
        """The current run of bad steps: (step, window, reason)."""

    def window(self, step: int) -> int:
        """The data window of `step`: the step-th window of the stream once the skipped ones are left out."""
        index = step
        for skipped in self.skipped:  # ascending: each skipped window at or before the index shifts it on by one
            if skipped <= index:
                index += 1
        return index

    def judge(self, step: int, window: int, loss: float, grad_norm: float) -> str | None:
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

    def rolled_back(self, to_step: int, state: GuardState) -> GuardEvent:
        """After the trainer reloaded the checkpoint of `to_step` (whose guard state is `state`): leave the bad
        steps' windows out for good and judge on from the checkpoint's loss window."""
        windows = [window for _, window, _ in self.bad]
        reasons = "; ".join(f"step {step}: {reason}" for step, _, reason in self.bad)
        event = GuardEvent(
            step=to_step,
            action="rolled back",
            reason=f"{len(self.bad)} bad steps in a row: {reasons}",
            windows=windows,
            from_step=self.bad[-1][0],
        )
        self.restore(GuardState(sorted({*self.skipped, *state.skipped, *windows}), state.losses))
        return event

    def skip_event(self) -> GuardEvent:
        step, window, reason = self.bad[-1]
        return GuardEvent(step=step, action="skipped", reason=reason, windows=[window])

    def state(self) -> GuardState:
        return GuardState(skipped=list(self.skipped), losses=list(self.losses))

    def restore(self, state: GuardState) -> None:
        self.skipped, self.bad = sorted(set(state.skipped)), []
        self.losses = deque(state.losses[-self.spike.window :], maxlen=self.spike.window)


def read_guard_state(manifest: Manifest) -> GuardState:
    """The guard state a checkpoint's manifest holds (checked as the manifest was read: checkpoint.manifest's
    GuardState); a manifest from before the guard holds none: empty."""
    return manifest.guard if manifest.guard is not None else GuardState(skipped=[], losses=[])
