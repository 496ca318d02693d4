"""The report's plots, PNG files beside report.md: loss, throughput, the step time breakdown, power per node, where
each segment's wall time went (goodput) and the downstream evaluations against tokens.

plot_loss(steps, evals, Path("runs/default/report/loss.png"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from trainflow.atomic import atomic_path  # noqa: E402
from trainflow.campaign.records import StepChange  # noqa: E402
from trainflow.energy.phases import power_series, trace_host  # noqa: E402
from trainflow.energy.report import SegmentEnergy  # noqa: E402
from trainflow.evaluate.records import EvalRecord as EvalScores  # noqa: E402  (train's EvalRecord is the val loss)
from trainflow.resilience.goodput import TERMS  # noqa: E402
from trainflow.train.step_log import EvalRecord, StepRecord  # noqa: E402
from trainflow.train.summary import SegmentSummary  # noqa: E402

BREAKDOWN = (
    ("data_s", "data loading"),
    ("compute_s", "compute"),
    ("dp_comm_s", "exposed DP comm"),
    ("bubble_s", "pipeline bubble"),
    ("activation_s", "activation send/recv"),
)
"""The step record's parts, as the breakdown plot and table name them."""


def figure(title: str, xlabel: str, ylabel: str) -> tuple[plt.Figure, plt.Axes]:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    return fig, ax


def save(fig: plt.Figure, out: Path) -> None:
    """Write the figure atomically (trainflow.atomic) and free it."""
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def plot_loss(
    steps: Sequence[StepRecord], evals: Sequence[EvalRecord], out: Path, changes: Sequence[StepChange] = ()
) -> None:
    """The train and validation losses; a dotted line at each step a setting changed from (the lineage)."""
    fig, ax = figure("Loss", "step", "cross-entropy (nats/token)")
    ax.plot([r.step + 1 for r in steps], [r.loss for r in steps], label="train", lw=1)
    ax.plot([e.step for e in evals], [e.val_loss for e in evals], "o-", label="validation")
    mixed = sorted({name for e in evals if len(e.sources) > 1 for name in e.sources})  # data.sources: each one's
    for name in mixed:
        points = [(e.step, e.sources[name]) for e in evals if name in e.sources]
        ax.plot(*zip(*points), ".--", lw=1, label=f"validation: {name}")
    by_step: dict[int, list[str]] = {}
    for c in changes:
        by_step.setdefault(c.step, []).append(c.change.key)
    for step, keys in sorted(by_step.items()):
        ax.axvline(step, color="grey", ls=":", lw=1)
        label = ", ".join(keys[:2]) + (f" +{len(keys) - 2}" if len(keys) > 2 else "")
        ax.annotate(label, (step, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", size=7)
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, out)


def plot_throughput(steps: Sequence[StepRecord], out: Path) -> None:
    fig, ax = figure("Throughput", "step", "tokens/s (all devices)")
    ax.plot([r.step + 1 for r in steps], [r.tokens_per_s for r in steps], lw=1)
    ax.grid(alpha=0.3)
    save(fig, out)


def plot_breakdown(steps: Sequence[StepRecord], out: Path) -> None:
    fig, ax = figure("Step time breakdown", "step", "ms per step")
    parts = [[getattr(r, key) * 1e3 for r in steps] for key, _ in BREAKDOWN]
    ax.stackplot([r.step + 1 for r in steps], *parts, labels=[label for _, label in BREAKDOWN])
    ax.legend(loc="upper right", fontsize=8)
    save(fig, out)


def plot_power(segments: Sequence[SegmentEnergy], cpu_watts_per_core: float, out: Path) -> None:
    fig, ax = figure("Power per node", "seconds since the segment's sampler started", "W per node")
    for seg in segments:
        for path in seg.power_traces:
            times, watts, source = power_series(path, cpu_watts_per_core)
            ax.plot(times, watts, lw=1, label=f"segment {seg.segment}, {trace_host(path)} ({source})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, out)


def plot_goodput(segments: Sequence[SegmentSummary], out: Path) -> None:
    """One stacked bar per segment: its wall time by term (resilience.goodput), productive steps at the bottom."""
    fig, ax = figure("Where the wall time went", "segment", "seconds")
    measured = [s for s in segments if s.goodput is not None]
    bottom = [0.0] * len(measured)
    for term in TERMS:
        heights = [s.goodput.seconds.get(term, 0.0) for s in measured]
        if any(heights):
            ax.bar([str(s.segment) for s in measured], heights, bottom=bottom, label=term)
            bottom = [b + h for b, h in zip(bottom, heights)]
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
    save(fig, out)


def plot_evaluations(records: Sequence[EvalScores], labels: dict[str, str], out: Path) -> None:
    """Each task's acc against the tokens its checkpoint was trained on, one line per task and phase (`labels`: a
    series' phase name), a dashed one for acc_norm."""
    fig, ax = figure("Downstream evaluations", "tokens trained", "accuracy")
    lines: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for r in records:
        for t in r.tasks:
            lines.setdefault((t.task, r.series, "acc"), []).append((r.tokens, t.acc))
            if t.acc_norm is not None:
                lines.setdefault((t.task, r.series, "acc_norm"), []).append((r.tokens, t.acc_norm))
    for (task, series, metric), points in lines.items():
        phase = f" ({labels[series]})" if labels.get(series) else ""
        ax.plot(*zip(*sorted(points)), "o-" if metric == "acc" else "x--", lw=1, label=f"{task} {metric}{phase}")
    if not lines:
        ax.text(0.5, 0.5, "no evaluations", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=7)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    save(fig, out)
