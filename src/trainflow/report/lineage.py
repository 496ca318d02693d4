"""The report's lineage section: every segment, what it continued from, the code it ran and the settings its jobs
changed (campaign.records.Lineage), so a campaign steered under way says which steps which settings trained.

lines = lineage_section(segments)
"""

from __future__ import annotations

from collections.abc import Sequence

from trainflow.campaign.records import StepChange
from trainflow.report.sections import table
from trainflow.train.summary import SegmentSummary

SHOWN = 4
"""Changes a row spells out; the rest are counted."""


def changes_of(segments: Sequence[SegmentSummary]) -> list[StepChange]:
    """Every change the segments' jobs made, in step order (the loss plot marks them)."""
    return sorted((c for s in segments if s.lineage for c in s.lineage.changes), key=lambda c: c.step)


def lineage_section(segments: Sequence[SegmentSummary]) -> list[str]:
    rows = []
    for s in segments:
        if s.lineage is None:
            rows.append([s.segment, f"{s.start_step}-{s.end_step}", "-", "-", "not recorded (format 1)"])
            continue
        lines = [f"step {c.step}: `{c.change.line()}`" for c in s.lineage.changes]
        more = f"; and {len(lines) - SHOWN} more" if len(lines) > SHOWN else ""
        changed = "; ".join(lines[:SHOWN]) + more or "none"
        code = s.lineage.code.line() if s.lineage.code else "not recorded"
        rows.append([s.segment, f"{s.start_step}-{s.end_step}", s.lineage.continued_from, code, changed])
    steered = [s.segment for s in segments if s.lineage and s.lineage.changes]
    said = (
        f"Settings changed in segment(s) {', '.join(map(str, steered))}; the loss plot marks each change's step."
        if steered
        else "No setting changed between the segments."
    )
    return [
        "## Lineage",
        "",
        "What each segment continued from, the code its last job ran and every setting its jobs changed against the "
        f"checkpoint they resumed from (docs/runs.md). {said}",
        "",
        table(rows, ["segment", "steps", "continued from", "code", "changes"]),
        "",
    ]
