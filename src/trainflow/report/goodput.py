"""The report's goodput section: where each segment's wall time went, the jobs it took, the loss guard's skips and
rollbacks, and the ranks slower than the rest.

    lines = goodput_section(segments, plot, here, straggler_factor=1.5, planned=plan)   # stages.report does
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import median

from trainflow.badput import GOODPUT_MEASUREMENT
from trainflow.plan.from_run import TERMS, RunPlan, mtbf
from trainflow.report.sections import relative, table
from trainflow.resilience.goodput import TERMS as MEASURED
from trainflow.resilience.ledger import NO_FAILURE
from trainflow.resilience.timing import stragglers
from trainflow.train.summary import SegmentSummary

SLOWEST = 16
"""Ranks the per-rank table shows, slowest first (a 4096-rank job's table would bury the report)."""


def goodput_section(
    segments: Sequence[SegmentSummary],
    plot: str,
    here: Path,
    *,
    straggler_factor: float,
    planned: RunPlan | None = None,
) -> list[str]:
    measured = [s for s in segments if s.goodput is not None]
    rows = [
        [s.segment, f"{s.goodput.wall_s:.1f}", f"{s.goodput.goodput:.1%}", len(s.goodput.jobs)]
        + [f"{s.goodput.seconds.get(term, 0.0):.1f}" for term in MEASURED]
        + [f"{s.goodput.unaccounted:.1%}"]
        for s in measured
    ]
    lines = [
        "## Goodput",
        "",
        "Each segment's wall time, from its first job's submission to its last job's end, in seconds by where it "
        "went (resilience.goodput); goodput is the productive steps' share.",
        "",
        table(rows, ["segment", "wall s", "goodput", "jobs", *MEASURED, "unaccounted"]),
        "",
        f"![goodput]({relative(plot, here)})",
        "",
        *planned_against_measured(planned),
        *jobs(measured),
        *guard(segments),
        *slow_ranks(segments, straggler_factor),
    ]
    return lines


def planned_against_measured(plan: RunPlan | None) -> list[str]:
    """The campaign's goodput planned from its own terms (plan.from_run) beside the measured, term by term."""
    if plan is None:
        return []
    met, m = plan.met, plan.measured_seconds
    rows = [
        [k, f"{met.seconds[k]:.1f}", f"{m[k]:.1f}", f"{m[k] - met.seconds[k]:+.1f}", GOODPUT_MEASUREMENT.get(k, "")]
        for k in (*TERMS, "wall")
    ]
    rows.append(["goodput", f"{met.goodput:.1%}", f"{plan.measured:.1%}", f"{plan.measured - met.goodput:+.1%}", ""])
    band = f"{met.low:.1%}-{met.high:.1%}"
    verdict = (
        f"The measured goodput lies outside the plan's 5-95 % band ({band}): {plan.differs_most} differs most."
        if plan.differs_most
        else f"The measured goodput lies inside the plan's 5-95 % band ({band})."
    )
    injected = plan.injected
    prior = (
        f" At the injected fault.mtbf_s ({injected.mtbf_s:.4g} s) the plan gives {injected.goodput:.1%} "
        f"({injected.low:.1%}-{injected.high:.1%}), {injected.failures:.3g} failures expected."
        if injected
        else ""
    )
    return [
        "### Planned against measured",
        "",
        f"The campaign's goodput planned from its own measured terms (trainflow.plan.from_run: the planner's "
        f"simulation of its step, save, evaluation, detection, restart and job-start times at the failure rate it met, "
        f"MTBF {mtbf(met.mtbf_s)}, {met.failures:.3g} failures expected), in seconds over every segment.{prior}",
        "",
        table(rows, ["term (trainflow.badput)", "planned", "measured", "difference", "ml-goodput-measurement"]),
        "",
        verdict,
        "",
    ]


def jobs(segments: Sequence[SegmentSummary]) -> list[str]:
    """The failed jobs and what was done about each: the verdict, the way it was recovered (peers: the survivors
    kept their processes and the failed node's ranks took their state from a live replica; job: every rank
    relaunched from the newest checkpoint) and the seconds from the failure to the next trained step."""
    rows = []
    for s in segments:
        runs = s.goodput.jobs
        for j, after in zip(runs, [*runs[1:], None]):
            if j.outcome in NO_FAILURE:
                continue
            way = ("peers" if after.recovery == "peers" else "job") if after else "none"
            first = f"{after.first_step_s:.1f}" if after and after.first_step_s is not None else ""
            rows.append([s.segment, j.attempt, j.job_id, j.outcome, j.line, j.verdict, way, first])
    if not rows:
        return []
    header = ["segment", "job", "id", "kind", "failure", "verdict", "recovery", "to first step (s)"]
    return ["### Failed jobs", "", table(rows, header), ""]


def guard(segments: Sequence[SegmentSummary]) -> list[str]:
    events = [f"- segment {s.segment}, {e.line()}" for s in segments for e in s.guard]
    return ["### Loss guard", "", *events, ""] if events else []


def slow_ranks(segments: Sequence[SegmentSummary], factor: float) -> list[str]:
    """Per-host medians of every rank's own forward time (train.clock), and the ranks above `factor` x the median."""
    timings = segments[-1].ranks
    if not timings:
        return []
    hosts: dict[str, list[float]] = {}
    for t in timings:
        hosts.setdefault(t.host, []).append(t.forward_s)
    rows = [[host, len(times), f"{median(times) * 1e3:.1f}"] for host, times in sorted(hosts.items())]
    flagged = stragglers(timings, factor)
    verdict = (
        "Stragglers (median forward above "
        f"{factor:g} x the median over ranks): "
        + ", ".join(f"rank {t.rank} on {t.host} ({t.forward_s * 1e3:.1f} ms)" for t in flagged)
        if flagged
        else f"No rank's median forward exceeds {factor:g} x the median over ranks (resilience.straggler_factor)."
    )
    slowest = sorted(timings, key=lambda t: -t.forward_s)[:SLOWEST]
    ranks = [[t.rank, t.host, f"{t.forward_s * 1e3:.1f}", t.steps] for t in slowest]
    shown = f"the {SLOWEST} slowest of {len(timings)}" if len(timings) > SLOWEST else "every rank"
    return [
        f"### Forward time per rank (segment {segments[-1].segment})",
        "",
        table(rows, ["host", "ranks", "median forward ms"]),
        "",
        f"Per rank ({shown}):",
        "",
        table(ranks, ["rank", "host", "median forward ms", "steps"]),
        "",
        verdict,
        "",
    ]
