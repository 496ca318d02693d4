"""The plan from a run's own terms: a finished campaign's measured step, save, evaluation, detection, restart and
job-start times, put through the planner's simulation (trainflow.plan.failures) at the failure rate the run met, and
set beside what the run measured, term by term.

    python -m trainflow.plan --from-run runs/<run>

train_segment writes the terms (RunTerms, terms.json beside the segments' summaries) from the jobs ledger and
spans.jsonl (trainflow.train.run_terms); this module only reads them, so the planner stays below the training loop.
The campaign's timeline (plan.failures.Timeline) takes
- work: the kept steps' measured time; tau: the interval's steps of it; e: evaluation over the kept steps' time;
- C, the write: a save's mean blocking and (async) background write;
- D: a failed job's mean detection (its last span to its end); wait, held: a restart's mean gap and queue, and its
  start-up and load up to its first step;
- the job starts: every planned job's queue, start-up, load and shutdown, the gaps inside jobs, and the saves beyond
  the interval's (each segment's last).
The failures: the rate the run met (its failed jobs over the time it was at risk, trainflow.resilience.arrivals), and
the injected fault.mtbf_s, each simulated over TRIALS seeded campaigns with its 5-95 % band. Planned seconds by term are
the simulated wall time split as the closed form's terms split it: the failures expected x D and x R, the checkpoints
and evaluations of the work, the job starts, and lost work the rest.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainflow.badput import Badput
from trainflow.config.run_folder import RunFolder
from trainflow.errors import TrainflowError
from trainflow.plan.failures import Timeline, failures, simulate
from trainflow.records import Record, RecordError, read_json

TERMS = tuple(b.value for b in Badput)
"""The terms planned and measured are compared by (trainflow.badput's categories); with productive they hold the whole
wall time."""
TRIALS = 4000
"""Ten times the planner's (plan.goodput.TRIALS): a run is held to its plan within points, and the planned seconds by
term come from the trials' mean wall time, whose spread the 400 trials leave at about 8 % of one failure's cost."""
SEED = 33
MAX_BYTES = 1 << 20
"""More than any terms.json holds: a bigger one is not read."""
BAND = (5.0, 95.0)
NO_FAILURES_S = 1e15
"""The MTBF a run without failures is planned at: none expected in a campaign of any length."""
MAX_SECONDS = 1e9
"""More seconds than any term of a campaign holds (31 years): a terms.json that claims them was altered."""


class RunTermsError(TrainflowError):
    """A terms.json whose values no run measures."""


@dataclass(frozen=True)
class RunTerms(Record):
    """A finished campaign's measured terms, in seconds (terms.json: trainflow.train.run_terms writes it)."""

    segments: int
    steps: int
    """Kept steps: the ones the final model contains."""
    failures: int
    """Failed jobs (a dead, hung or raising rank)."""
    hangs: int
    """Of them, those the heartbeat found hung."""
    step_s: float
    """The kept steps' mean, with their bookkeeping (resilience.goodput's productive term per step)."""
    eval_share: float
    interval_steps: int
    blocking_s: float
    write_s: float
    detect_s: float
    wait_s: float
    held_s: float
    starts_s: float
    """The planned job starts (queue, start-up, load, shutdown, the gaps inside jobs), over the campaign."""
    boundary_saves_s: float
    """The saves beyond the interval's: each segment's last."""
    at_risk_s: float
    """The time failures could strike in: training, saves and evaluations, and each restart's start-up and load."""
    mtbf_s: float
    """fault.mtbf_s injected (0: none)."""
    hang_share: float
    measured: dict[str, float]
    """Seconds by TERMS, and productive and wall."""

    def check(self, where: str) -> RunTerms:
        """Itself, where every value is one a run measures; else one RunTermsError naming the field."""
        counts = {k: getattr(self, k) for k in ("segments", "steps", "failures", "hangs", "interval_steps")}
        seconds = {k: getattr(self, k) for k in ("step_s", "blocking_s", "write_s", "detect_s", "wait_s", "held_s")}
        seconds |= {k: getattr(self, k) for k in ("starts_s", "boundary_saves_s", "at_risk_s", "mtbf_s")}
        seconds |= {f"measured.{k}": v for k, v in self.measured.items()}
        bad = [f"{k}={v!r} (a count from 0 to 2^31)" for k, v in counts.items() if not 0 <= v < 2**31]
        bad += [f"{k}={v!r} (seconds from 0 to {MAX_SECONDS:g})" for k, v in seconds.items() if not ok_seconds(v)]
        bad += [f"{k}={v!r} (a share from 0 to 1)" for k, v in self.shares().items() if not 0 <= v <= 1]
        bad += [] if self.interval_steps >= 1 and self.steps >= 1 and self.step_s > 0 else ["no kept step or interval"]
        bad += [] if {*TERMS, "productive", "wall"} <= self.measured.keys() else ["measured lacks a term"]
        bad += [] if self.hangs <= self.failures else [f"hangs={self.hangs} > failures={self.failures}"]
        if bad:
            raise RunTermsError(f"{where} holds {bad[0]}, which no run measures; rerun train_segment to rewrite it")
        return self

    def shares(self) -> dict[str, float]:
        return {"eval_share": self.eval_share, "hang_share": self.hang_share}

    @property
    def met_mtbf_s(self) -> float:
        """The rate the run met: its time at risk over its failures (NO_FAILURES_S without one)."""
        return self.at_risk_s / self.failures if self.failures else NO_FAILURES_S

    def timeline(self, mtbf_s: float) -> Timeline:
        return Timeline(
            work_s=self.steps * self.step_s,
            interval_s=self.interval_steps * self.step_s,
            blocking_s=self.blocking_s,
            write_s=self.write_s,
            detect_s=self.detect_s,
            wait_s=self.wait_s,
            held_s=self.held_s,
            mtbf_s=mtbf_s,
            jobs_s=self.starts_s + self.boundary_saves_s,
            eval_share=self.eval_share,
        )


def ok_seconds(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= MAX_SECONDS


@dataclass(frozen=True)
class Planned(Record):
    """The simulation's goodput at one MTBF, its band and its wall time by term."""

    mtbf_s: float
    goodput: float
    """The work over the trials' mean wall time: what one campaign of that wall time keeps. The mean over trials of
    work / wall (plan.goodput's figure) exceeds it by about the wall time's relative variance (Jensen): 1.7 points for
    a campaign of three failures each costing a fifth of its wall time, nothing for the seed's thousands."""
    trials_mean: float
    """The mean over trials of work / wall, as plan.goodput gives it."""
    low: float
    high: float
    failures: float
    """Failures one campaign expects."""
    seconds: dict[str, float]
    """TERMS, productive and wall, from the mean wall time."""


@dataclass(frozen=True)
class RunPlan(Record):
    """A run's plan from its own terms beside what it measured."""

    measured: float
    """The run's goodput: productive over wall."""
    measured_seconds: dict[str, float]
    met: Planned
    """At the rate the run met (its failures over its time at risk)."""
    injected: Planned | None
    """At fault.mtbf_s; None where no failures were injected."""
    differs_most: str | None
    """Where the measured goodput lies outside the met plan's band: the term whose seconds differ most; else None."""


def read_terms(run: str | Path) -> RunTerms:
    """The newest campaign's terms in the run folder `run` (runs/<run>); else one RunTermsError saying why."""
    found = sorted(Path(run).glob(os.path.relpath(RunFolder(".", "", "", "*").run_terms)), key=os.path.getmtime)
    if not Path(run).is_dir() or not found:
        raise RunTermsError(
            f"{run} holds no train/<series>/terms.json: pass a run folder, runs/<run>, whose train_segment finished a "
            "segment (it writes the terms after each)"
        )
    return load_terms(found[-1])


def load_terms(path: Path) -> RunTerms:
    """terms.json at `path`, every value checked; else one RunTermsError naming the file."""
    try:
        data = read_json(path, fix="rerun train_segment to rewrite it", limit=MAX_BYTES)
    except FileNotFoundError:
        raise RunTermsError(f"{path} is missing; rerun train_segment to write it") from None
    except RecordError as err:  # no regular file, too big, or no JSON: its line says which
        raise RunTermsError(str(err)) from None
    try:
        return RunTerms.from_json(data, where=str(path)).check(str(path))
    except (ValueError, RecordError) as err:
        raise RunTermsError(
            f"{path} does not read as a run's terms ({str(err).splitlines()[0]}); rerun train_segment"
        ) from None


def planned(terms: RunTerms, mtbf_s: float) -> Planned:
    """The simulation of the run's timeline at mtbf_s (its band over TRIALS seeds), its mean wall time by term."""
    t = terms.timeline(mtbf_s)
    sim = simulate(t, trials=TRIALS, seed=SEED)
    if sim is None:
        raise RunTermsError(
            f"the run's terms at an MTBF of {mtbf_s:.4g} s give a campaign the simulation cannot finish (detection "
            f"{t.detect_s:.3g} s and restart {t.restart_s:.3g} s against that MTBF); its goodput is about 0"
        )
    (low, high), wall = np.percentile(sim, BAND), float(np.mean(t.work_s / sim))
    expects = failures(t) if mtbf_s < NO_FAILURES_S else 0.0  # 1e-14, not 0, in floating point
    pieces = max(1, math.ceil(t.run_s / t.stretch_s))
    seconds = {
        Badput.CHECKPOINT.value: (pieces - 1) * t.blocking_s + terms.boundary_saves_s,
        Badput.DETECTION.value: expects * t.detect_s,
        Badput.RESTART.value: expects * t.restart_s,
        Badput.START_UP.value: terms.starts_s,
        Badput.EVALUATION.value: t.work_s * t.eval_share,
        "productive": t.work_s,
    }
    seconds[Badput.LOST_WORK.value] = max(0.0, wall - sum(seconds.values()))
    goodput = t.work_s / wall
    return Planned(mtbf_s, goodput, float(sim.mean()), float(low), float(high), expects, {**seconds, "wall": wall})


def plan_run(terms: RunTerms) -> RunPlan:
    """The run's plan at the rate it met and at the injected MTBF, beside its measured goodput."""
    m = terms.measured
    measured = m["productive"] / m["wall"] if m["wall"] > 0 else 0.0
    met = planned(terms, terms.met_mtbf_s)
    inside = met.low - 1e-9 <= measured <= met.high + 1e-9
    most = None if inside else max(TERMS, key=lambda k: abs(m[k] - met.seconds[k]))
    return RunPlan(
        measured=measured,
        measured_seconds=dict(m),
        met=met,
        injected=planned(terms, terms.mtbf_s) if terms.mtbf_s else None,
        differs_most=most,
    )


def render_run_plan(plan: RunPlan) -> list[str]:
    """The plan beside the measurement, as lines: goodput with its band, then seconds by term."""
    met, m = plan.met, plan.measured_seconds
    lines = [
        f"measured goodput {plan.measured:.1%}; planned from the run's terms {met.goodput:.1%} "
        f"(5-95 % {met.low:.1%}-{met.high:.1%}) at the MTBF it met, {mtbf(met.mtbf_s)}, "
        f"{met.failures:.3g} failures expected",
    ]
    if plan.injected:
        i = plan.injected
        lines.append(
            f"at the injected fault.mtbf_s {mtbf(i.mtbf_s)}: {i.goodput:.1%} (5-95 % {i.low:.1%}-{i.high:.1%}), "
            f"{i.failures:.3g} failures expected"
        )
    if plan.differs_most:
        lines.append(f"measured lies outside the band: {plan.differs_most} differs most")
    lines += [
        f"{k:>11}: planned {met.seconds[k]:9.1f} s, measured {m[k]:9.1f} s, {m[k] - met.seconds[k]:+9.1f} s"
        for k in (*TERMS, "productive", "wall")
    ]
    return lines


def mtbf(seconds: float) -> str:
    return "none (no failure)" if seconds >= NO_FAILURES_S else f"{seconds:.4g} s"
