"""A CampaignStatus as lines for a person (a progress bar on a terminal) and as JSON for a script."""

from __future__ import annotations

import json
import math

from trainflow.resilience.probation import clock
from trainflow.status.read import CampaignStatus, State

BAR = 30
PRINTABLE_LIMIT = 240


def clean(text: str, limit: int = PRINTABLE_LIMIT) -> str:
    """A string from a run folder's file, safe to print: no control characters (a terminal's escapes), one line."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value) or value < 0:
        return "?"
    if value >= 1e9:
        return "over 30 years"
    days, rest = divmod(int(value), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{value:.1f} s"


def number(value: float | None, spec: str) -> str:
    return "?" if value is None or not math.isfinite(value) else format(value, spec)


def render(status: CampaignStatus, *, bar: bool) -> str:
    s = status
    share = min(max(s.step / s.total_steps, 0.0), 1.0)
    where = f"segment {s.in_flight} of {s.segments}" if s.in_flight is not None else f"all {s.segments} segments"
    progress = f"{100 * share:5.1f} %  step {s.step}/{s.total_steps}"
    if bar:
        filled = round(BAR * share)
        progress = f"[{'#' * filled}{'-' * (BAR - filled)}] {progress}"
    lines = [
        f"Run {clean(s.run)}, campaign {clean(s.series)} ({clean(s.folder)})",
        f"{progress}  {s.state.value}: {where}, {len(s.done)} done",
    ]
    if s.loss is not None:
        age = f", the last step ended {seconds(s.last_step_age_s)} ago" if s.state is not State.FINISHED else ""
        lines.append(
            f"Loss {number(s.loss, '.4f')}, {number(s.tokens_per_s, ',.0f')} tokens/s, "
            f"{number(s.step_s, '.3f')} s/step (median of the newest steps){age}"
        )
    goodput = (
        f"{number(100 * s.goodput, '.1f')} % of {seconds(s.wall_s)}" if s.goodput is not None else "not measured yet"
    )
    lines.append(f"Goodput so far: {goodput}")
    if s.eta_s is not None:
        at = f", {seconds(s.eta_wall_s)} at the goodput so far" if s.eta_wall_s is not None else ""
        lines.append(f"ETA: {seconds(s.eta_s)} of steps at the measured step time{at}")
    lines.append(checkpoint_line(s))
    lines.append(evaluation_line(s))
    if (c := s.last_change) is not None:
        lines.append(f"Last change: from step {c.step} (segment {c.segment}): {clean(c.change.line())}")
    lines.append(f"Jobs: {s.restarts} restart(s) after a failure, {s.requeues} Slurm requeue(s) of finished segments")
    for job in s.failures:
        line = f": {clean(job.line)}" if job.line else ""
        lines.append(f"  Failed: segment {job.segment} job {clean(job.job_id)} {clean(job.outcome)}{line}")
        lines.append(f"    verdict: {clean(job.verdict) or 'none recorded'}")
    lines.append(f"Excluded hosts: {', '.join(s.excluded) if s.excluded else 'none'}")
    for host in s.returned:
        lines.append(f"  Returned: {clean(host.host)} at {clock(host.at)}: {clean(host.evidence)}")
    return "\n".join(lines)


def checkpoint_line(s: CampaignStatus) -> str:
    c = s.checkpoint
    if c is None:
        return "Checkpoint: none complete yet"
    how = "CRC-32C re-read by verify_checkpoint" if c.verified else "its CRCs not re-read yet (verify_checkpoint)"
    passed = f"; passed over {len(c.skipped)} newer: {clean(c.skipped[0])}" if c.skipped else ""
    return f"Checkpoint: step {c.step}, complete (its folder holds what its manifest lists), {how}{passed}"


def evaluation_line(s: CampaignStatus) -> str:
    e = s.evaluation
    if e is None:
        return "Evaluation: none yet (the evaluate stage scores each evaluated segment's last checkpoint)"
    scores = "; ".join(
        f"{clean(t.task)} acc {number(t.acc, '.3f')}"
        + (f", acc_norm {number(t.acc_norm, '.3f')}" if t.acc_norm is not None else "")
        for t in e.tasks
    )
    return f"Evaluation: step {e.step} ({e.tokens:,} tokens): {scores or 'no task scored (evaluate.tasks)'}"


def as_json(status: CampaignStatus) -> str:
    """The status as one JSON object (a value not finite is null: strict JSON has no NaN)."""
    return json.dumps(finite(status.to_json()), sort_keys=True)


def finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
