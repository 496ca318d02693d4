"""The campaign's own records: what it is (campaign.json), what each checkpoint series is (series.json), the settings
each job changed (changes.jsonl) and each completed segment's lineage (lineage.jsonl). Torch-free: the workflow reads
them when it builds the DAG, trainflow.status and the report afterwards.

    python -c "from trainflow.journal import Journal; from trainflow.campaign.records import Lineage; \
        print(Journal('runs/default/capacity/checkpoints/<series>/lineage.jsonl', Lineage).read())"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from trainflow.code_version import CodeVersion
from trainflow.config.identity import Change
from trainflow.records import Record, fields_added


@dataclass(frozen=True)
class CampaignRecord(Record):
    """runs/<run>/campaign.json: the campaign's identity when its first segment started. Every DAG and segment of the
    run is checked against it (campaign.check): another model under the same run name is refused."""

    run: str
    series: str
    """Its main series (config.identity.series_key)."""
    identity: dict[str, object]
    """config.identity.identity at its start."""
    seed: int
    """The main series' train.seed."""
    started: float
    code: CodeVersion


@dataclass(frozen=True)
class Parent(Record):
    """Where a branch starts: a checkpoint of another series of the campaign."""

    series: str
    step: int

    def line(self) -> str:
        return f"{self.series}@{self.step}"


@dataclass(frozen=True)
class SeriesRecord(Record):
    """checkpoints/<series>/series.json, written when the series' first segment starts."""

    FORMAT: ClassVar[int] = 2
    MIGRATIONS: ClassVar[dict[int, Callable[[dict], dict]]] = {1: fields_added}  # 2: phase

    series: str
    seed: int
    """The train.seed its data is drawn with: a later segment with another seed is refused (branch instead)."""
    parent: Parent | None
    """A branch's starting checkpoint (train.branch_from), a later phase's its parent phase's; None: the main series."""
    started: float
    phase: str = ""
    """The phase it trains (config.phases); '': the first, or a campaign without phases."""


@dataclass(frozen=True)
class StepChange(Record):
    """A setting a job changed against the checkpoint it resumed from (changes.jsonl): it applied from `step`."""

    step: int
    segment: int
    change: Change


@dataclass(frozen=True)
class Lineage(Record):
    """A completed segment's lineage (lineage.jsonl, and its summary's `lineage`)."""

    segment: int
    start_step: int
    end_step: int
    continued_from: str
    """What its first step started from: `<series>@<step>` (a checkpoint of this series, a branch's parent, or
    io.resume_from's folder), `io.init_from <folder>`, or `random initialisation`."""
    code: CodeVersion | None
    """The code its last job ran (the code.* changes say where an upgrade fell); None: not recorded (a segment of
    trainflow before campaign records, train.adopt)."""
    changes: list[StepChange] = field(default_factory=list)
    """Every setting its jobs changed, at the step each applied from (config.identity: settings, code, schedule)."""

    def line(self) -> str:
        what = "; ".join(f"step {c.step}: {c.change.line()}" for c in self.changes) or "no change"
        return f"segment {self.segment} (steps {self.start_step}-{self.end_step}) from {self.continued_from}: {what}"
