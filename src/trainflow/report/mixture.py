"""The report's data-mixture section (data.sources): each source's weight, the share of the tokens it gave in every
segment (the realised mixture, data.mixture) and its validation loss; a plain data.corpus has none.

lines = mixture_section(segments, evals)
"""

from __future__ import annotations

from collections.abc import Sequence

from trainflow.report.sections import table
from trainflow.train.step_log import EvalRecord
from trainflow.train.summary import SegmentSummary


def mixture_section(segments: Sequence[SegmentSummary], evals: Sequence[EvalRecord]) -> list[str]:
    mixed = [s for s in segments if len(s.mixture) > 1]
    if not mixed:
        return []
    first, last = evals[0], evals[-1]
    names = [share.name for share in mixed[-1].mixture]
    rows = [
        [
            f"`{name}`",
            f"{mixed[-1].mixture[i].weight:.1%}",
            *(f"{s.mixture[i].share:.2%} ({s.mixture[i].tokens:,})" for s in mixed),
            f"{first.sources.get(name, float('nan')):.4f} -> {last.sources.get(name, float('nan')):.4f}",
        ]
        for i, name in enumerate(names)
    ]
    header = ["source", "weight", *(f"segment {s.segment} share (tokens)" for s in mixed), "validation loss"]
    return [
        "### Data mixture",
        "",
        f"Training drew each batch's rows from {len(names)} sources in proportion to their weights (data.sources); the "
        "shares are of the input tokens of each segment's applied steps. The validation loss above is the sources' "
        f"weighted mean ({first.val_loss:.4f} -> {last.val_loss:.4f}); the loss plot shows each source's.",
        "",
        table(rows, header),
        "",
    ]
