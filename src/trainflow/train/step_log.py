"""Per-step records kept beside the checkpoints, so a resumed or rerun segment reports its whole range.

One JSON line per training step and per evaluation, appended by rank 0. On resume from step s,
the records of the steps this segment will redo are dropped first: they belong to work the
checkpoint does not contain. Records of other segments stay.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainflow.atomic import write_text_atomic


class StepLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def drop(self, start: int, end: int) -> None:
        """Remove the records of steps start..end inclusive (rewritten atomically)."""
        kept = [r for r in self.read() if not start <= r["step"] <= end]
        write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def between(self, start: int, end: int) -> list[dict]:
        return [r for r in self.read() if start <= r["step"] <= end]
