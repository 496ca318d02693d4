"""A journal: a JSONL file of typed records (trainflow.records), one appended per line and read back with every line
checked: the step, evaluation, guard and span logs of a segment, and the run's jobs ledger.

    python -c "from trainflow.journal import Journal; from trainflow.resilience.ledger import JobRun; \
        print(Journal('runs/default/capacity/checkpoints/<series>/jobs.jsonl', JobRun).read())"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Generic, TypeVar

from trainflow.atomic import write_text_atomic
from trainflow.records import Record

R = TypeVar("R", bound=Record)


class Journal(Generic[R]):
    """A JSONL file of records of one kind, appended a line at a time and read back, each line checked."""

    def __init__(self, path: str | Path, kind: type[R]) -> None:
        self.path, self.kind = Path(path), kind

    def read(self) -> list[R]:
        if not self.path.is_file():
            return []
        with open(self.path) as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
        return [self.kind.from_json(json.loads(line), where=f"{self.path}:{n}") for n, line in lines]

    def drop(self, start: int, end: int) -> None:
        """Remove the records of steps start..end inclusive (rewritten atomically)."""
        kept = [r for r in self.read() if not start <= r.step <= end]
        write_text_atomic(self.path, "".join(json.dumps(r.to_json()) + "\n" for r in kept))

    def append(self, record: R) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record.to_json()) + "\n")

    def between(self, start: int, end: int) -> list[R]:
        return [r for r in self.read() if start <= r.step <= end]
