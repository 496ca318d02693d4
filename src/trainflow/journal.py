"""A journal: a JSONL file of typed records (trainflow.records), one appended per line and read back with every line
checked: the step, evaluation, guard and span logs of a segment, and the run's jobs and hosts ledgers (opened by
resilience.ledger.jobs_ledger and hosts_ledger alone).

    python -c "from trainflow.journal import Journal; from trainflow.train.step_log import StepRecord; \
        print(Journal('runs/default/capacity/checkpoints/<series>/steps.jsonl', StepRecord).read(live=True)[-1:])"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Generic, TypeVar

from trainflow.atomic import write_text_atomic
from trainflow.records import JOURNAL_BYTES, Record, RecordError, read_file

R = TypeVar("R", bound=Record)


class Journal(Generic[R]):
    """A JSONL file of records of one kind, appended a line at a time and read back, each line checked."""

    def __init__(self, path: str | Path, kind: type[R]) -> None:
        self.path, self.kind = Path(path), kind

    def read(self, *, live: bool = False) -> list[R]:
        """Every record; none where the file is missing. A file that is no regular one, or a line that is no JSON of
        the record, is one RecordError naming it. `live`: another process may be appending to it now (trainflow.status
        reads a running campaign's), so a last line without its newline, one still being written, is left out."""
        fix = "it was altered: move it away (its records are lost)"
        try:
            text = read_file(self.path, fix=fix, limit=JOURNAL_BYTES)
        except FileNotFoundError:
            return []
        lines = text.split("\n")
        lines = lines[:-1] if live else lines  # the last: "" after a final newline, else a line being appended
        return [self.record(n, line, fix) for n, line in enumerate(lines, 1) if line.strip()]

    def record(self, n: int, line: str, fix: str) -> R:
        where = f"{self.path}:{n}"
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as err:
            raise RecordError(f"{where} is not a JSON line ({type(err).__name__}); {fix}") from None
        return self.kind.from_json(data, where=where)

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
