"""The report's Evaluations section: every evaluated checkpoint's task scores (the evaluate stage's records), by
phase and step, and their plot against tokens.

    lines = evaluations_section(records, labels, plot="runs/default/report/evaluations.png", here=out.parent)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainflow.config import TrainflowConfig
from trainflow.evaluate.records import EvalRecord, TaskScore
from trainflow.report.sections import relative, table


def phase_labels(cfg: TrainflowConfig) -> dict[str, str]:
    """Each phase's series -> its name (config.phases sets the series); empty without phases."""
    return {p.series: p.name for p in cfg.phases}


def score_text(s: TaskScore | None) -> str:
    if s is None:
        return "-"
    return f"{s.acc:.3f}" + (f" / {s.acc_norm:.3f}" if s.acc_norm is not None else "")


def evaluations_section(records: Sequence[EvalRecord], labels: dict[str, str], *, plot: str, here: Path) -> list[str]:
    """The table (one row per checkpoint, a column per task: acc / acc_norm, or exact match) and the plot."""
    if not records:
        return ["## Evaluations", "", "No checkpoint was evaluated (the evaluate stage's records: none given).", ""]
    tasks = list(dict.fromkeys(t.task for r in records for t in r.tasks))
    rows = []
    for r in sorted(records, key=lambda r: r.tokens):
        by_task = {t.task: t for t in r.tasks}
        phase = f"{labels[r.series]} (`{r.series}`)" if r.series in labels else f"`{r.series}`"
        validation = ", ".join(f"{name} {loss:.4f}" for name, loss in r.validation.items()) or "-"
        scores = (score_text(by_task.get(t)) for t in tasks)
        rows.append([phase, r.step, f"{r.tokens:,}", *scores, validation, f"{r.seconds:.1f}"])
    counts = ", ".join(f"{t} {next(s.n for r in records for s in r.tasks if s.task == t)}" for t in tasks)
    return [
        "## Evaluations",
        "",
        f"Each evaluated checkpoint's downstream tasks (the evaluate stage; items: {counts}): multiple choice as acc / "
        "acc_norm (by log-likelihood; acc_norm divides it by the choice's characters), generation as exact match; "
        "each source's validation loss on the batches the training ranks evaluate.",
        "",
        table(rows, ["phase (series)", "step", "tokens", *tasks, "validation loss", "seconds"]),
        "",
        f"![evaluations]({relative(plot, here)})",
        "",
    ]
