"""Where the training stream stands: the record a checkpoint's manifest carries (data.stream moves it; here, below
both, so the manifest's reader needs no data package).

    python -c "from trainflow.stream_position import StreamPosition; print(StreamPosition.start(block=8, names=['a']))"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainflow.errors import TrainflowError
from trainflow.records import Record


@dataclass(frozen=True)
class StreamPosition(Record):
    """Where the training stream stands (a checkpoint's `stream`)."""

    block: int
    """Draws come in blocks of this many source positions (the series' first train.global_batch)."""
    samples: int
    """The global position of the next sample."""
    sources: dict[str, int]
    """Each source's next sample, by name."""
    skipped: list[list[int]]
    """[start, end) ranges of global positions left out for good, ascending, each past `samples` or ended before."""

    def __post_init__(self) -> None:
        bad = self.block < 1 or self.samples < 0 or any(v < 0 for v in self.sources.values())
        if bad or any(len(r) != 2 or not 0 <= r[0] < r[1] for r in self.skipped):
            raise TrainflowError(
                "it holds a block under 1, a negative position or a skipped range that is no [start, end), which "
                "trainflow never writes; the checkpoint was altered: delete it (trainflow falls back to the previous "
                "one)"
            )

    @classmethod
    def start(cls, *, block: int, names: Sequence[str]) -> StreamPosition:
        return cls(block=block, samples=0, sources={n: 0 for n in names}, skipped=[])
