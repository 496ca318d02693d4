"""Where a segment's metrics go besides its step log: TensorBoard (observe.tensorboard), Weights & Biases
(observe.wandb) and MLflow (observe.mlflow), each a Tracker, chosen once from the config on rank 0.

    trackers = build_trackers(cfg, is_logger=rank == 0)   # train.recorder; [] on the other ranks
    tracker.step(record); tracker.evaluation(step, val_loss, sources); tracker.close()

Every tracker logs the same scalars at the step they describe: every number of a step record as `train/<key>` (loss,
lr, grad_norm, tokens_per_s, mfu, the step split in seconds, memory), `train/applied` (0 for a step the loss guard
skipped), and each evaluation as `eval/val_loss` (a mixture's sources as `eval/val_loss/<source>`). W&B and MLflow
also take the resolved config, and name their run after the campaign: one run per campaign (the hash of what
training reads), resumed by each segment and restart, and by the report stage, which adds the report's tables
(train.report_log). The W&B and MLflow clients are imported only when enabled.

A tracker is no part of training: each one is Guarded, so its first failure (its package missing, its server gone,
any exception of its client) is one warning line and the job goes on without it; its requests are bounded
(config.observe.REQUEST_S, RETRIES, STALL_S), so rank 0 never sits in one while the other ranks' collectives time out.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainflow.train.step_log import StepRecord

log = logging.getLogger(__name__)

SEPARATOR = re.compile(r"\|\s*:?-{3,}")
"""The row under a Markdown table's header: |---|---| or | --- | --- |."""
NOT_SCALARS = ("step", "started", "skipped", "window", "sources")
"""A step record's fields that are no metric: the step (the x axis), a wall-clock time, the guard's reason, its data
window's positions and its rows per source."""


def step_scalars(record: StepRecord) -> dict[str, float]:
    fields = dataclasses.asdict(record)
    scalars = {f"train/{k}": float(v) for k, v in fields.items() if k not in NOT_SCALARS}
    return {**scalars, "train/applied": float(record.skipped is None)}


def eval_scalars(val_loss: float, sources: dict[str, float]) -> dict[str, float]:
    """The weighted validation loss, and each source's (a mixture's only)."""
    each = {f"eval/val_loss/{name}": float(loss) for name, loss in sources.items()} if len(sources) > 1 else {}
    return {"eval/val_loss": float(val_loss), **each}


class Tracker(ABC):
    """One place a segment's metrics go."""

    @abstractmethod
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def step(self, record: StepRecord) -> None:
        self.log(step_scalars(record), record.step)

    def evaluation(self, step: int, val_loss: float, sources: dict[str, float]) -> None:
        self.log(eval_scalars(val_loss, sources), step)


@dataclass(frozen=True)
class Table:
    """One table of the campaign report, named after the section it lies in."""

    name: str
    columns: list[str]
    rows: list[list[str]]


class RunTracker(Tracker):
    """A tracker that keeps a run of the campaign (W&B, MLflow), which also takes the report when it is written."""

    @abstractmethod
    def report(self, text: str, tables: list[Table]) -> None: ...


REASON = 300
"""The most of a client's error the warning line quotes (MLflow's name the URL, the retries and their cause)."""


class Guarded(RunTracker):
    """A tracker whose failure is none of training's: the first exception of its start or of any call is one warning
    line naming the tracker, and then it logs nothing more in this process (its records stay in the step log)."""

    def __init__(self, name: str, start: Callable[[], Tracker]) -> None:
        self.name, self.tracker = name, None
        self.tracker = self.call("start", start)

    def call(self, what: str, action: Callable[[], Any]) -> Any:
        if self.tracker is None and what != "start":
            return None
        try:
            return action()
        except Exception as err:  # any client's error: W&B's, MLflow's, requests', a missing package
            reason = " ".join(f"{type(err).__name__}: {err}".split())
            reason = reason if len(reason) <= REASON else reason[: REASON - 3] + "..."
            log.warning("Tracker %s failed to %s (%s); training goes on without it", self.name, what, reason)
            self.tracker = None
            return None

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.call("log", lambda: self.tracker.log(scalars, step))

    def report(self, text: str, tables: list[Table]) -> None:
        self.call("take the report", lambda: self.tracker.report(text, tables))

    def close(self) -> None:
        self.call("close", lambda: self.tracker.close())


def markdown_tables(text: str) -> list[Table]:
    """The tables of a Markdown report (trainflow.report.sections.table's form: a header row, a separator, rows),
    each named after the heading above it (goodput, goodput-2 for a second one in that section)."""
    tables, heading, seen = [], "report", {}
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if line.startswith("#"):
            heading = re.sub(r"[^a-z0-9]+", "-", line.lstrip("#").strip().lower()).strip("-") or "report"
        elif line.startswith("| ") and n + 1 < len(lines) and SEPARATOR.match(lines[n + 1]):
            body = [cells(row) for row in itertools.takewhile(lambda r: r.startswith("| "), lines[n + 2 :])]
            seen[heading] = seen.get(heading, 0) + 1
            name = heading if seen[heading] == 1 else f"{heading}-{seen[heading]}"
            width = len(header := cells(line))
            tables.append(Table(name, header, [(row + [""] * width)[:width] for row in body]))
    return tables


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().removeprefix("|").removesuffix("|").split(" | ")]
