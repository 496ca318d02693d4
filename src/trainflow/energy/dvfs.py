"""The DVFS policy: which clock each phase of training runs at, and what that saves; a pure function of a trace.

    clocks = dvfs_clocks(phase_trace(steps), idle_mhz=500, compute_mhz=1980, min_phase_s=0.01)

The seed drops GPU clocks below 500 MHz while data loads and restores them for compute (~8 % saved).
A clock change is not free (the driver takes milliseconds to settle), so a data phase is run at the
idle clock only when the data phase before it lasted at least `min_phase_s`: the live controller
(control.py) knows only the past, and applying the same function to a recorded trace reproduces what
it did, or, where the driver refused, what it would have done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

PHASES = ("data", "compute", "checkpoint")
# Dynamic power scales roughly with f x V^2; at the seed's 500 MHz of 1980 the board draws about this share of
# its compute power (a stated assumption, used only for estimates: the counterfactual cannot be measured).
IDLE_CLOCK_POWER_SHARE = 0.45


@dataclass(frozen=True)
class Phase:
    kind: str
    """One of PHASES."""
    seconds: float


class StepMarks(Protocol):
    """What the energy accounting reads of a step record (trainflow.train.step_log.StepRecord)."""

    step: int
    started: float
    data_s: float
    step_s: float


class SaveMarks(Protocol):
    """What it reads of a checkpoint save (trainflow.train.summary.SaveRecord)."""

    step: int
    started: float
    save_s: float


def phase_trace(steps: Sequence[StepMarks], saves: Sequence[SaveMarks] = ()) -> list[Phase]:
    """The trainer's own markers as a trace: each step's data loading, then the rest of the step (forward,
    backward, optimizer), and each checkpoint save after the step it follows."""
    saved_after = {s.step: s.save_s for s in saves}
    trace = []
    for r in steps:
        trace += [Phase("data", r.data_s), Phase("compute", r.step_s - r.data_s)]
        if r.step + 1 in saved_after:
            trace.append(Phase("checkpoint", saved_after[r.step + 1]))
    return trace


def clock_for(kind: str, *, last_data_s: float | None, idle_mhz: int, compute_mhz: int, min_phase_s: float) -> int:
    """The clock of the next phase of `kind`, knowing how long the previous data phase lasted."""
    lower = kind == "data" and last_data_s is not None and last_data_s >= min_phase_s
    return idle_mhz if lower else compute_mhz


def dvfs_clocks(trace: list[Phase], *, idle_mhz: int, compute_mhz: int, min_phase_s: float) -> list[int]:
    """The clock each phase of the trace runs at under the policy."""
    clocks, last_data_s = [], None
    for phase in trace:
        clocks.append(
            clock_for(
                phase.kind, last_data_s=last_data_s, idle_mhz=idle_mhz, compute_mhz=compute_mhz, min_phase_s=min_phase_s
            )
        )
        if phase.kind == "data":
            last_data_s = phase.seconds
    return clocks


def lowered_s(trace: list[Phase], clocks: list[int], *, compute_mhz: int) -> float:
    """Seconds the policy ran below the compute clock."""
    return sum(p.seconds for p, mhz in zip(trace, clocks) if mhz < compute_mhz)


def dvfs_saving_j(seconds: float, *, gpus: int, gpu_watts: float) -> float:
    """Estimated joules saved by `seconds` at the idle clock: IDLE_CLOCK_POWER_SHARE of gpu_watts per GPU drawn."""
    return seconds * gpus * gpu_watts * (1 - IDLE_CLOCK_POWER_SHARE)
