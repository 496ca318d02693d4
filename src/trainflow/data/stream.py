"""The training stream, addressed by global sample position: each step takes the next global_batch samples, whatever
the batch, the layout or the mixture's weights were before. Torch-free.

    python -c "from trainflow.data.stream import DataStream, StreamPosition; \
        s = DataStream(StreamPosition.start(block=8, names=['corpus']), weights=[1.0], seed=0); print(s.take(16))"

Sample n of the stream comes from the source data.mixture assigns it (a pure function of the seed, n and the
weights), and is that source's next sample: each source keeps its own position, so a change of weights continues every
source where it stood (Megatron's blended datasets keep the same pair, dataset and sample index, per global sample).
Where a sample's window lies in its source is data.sampler's pure function of (seed, the source's position): drawn in
blocks of `block` positions, the series' first global batch, so a run whose batch never changed draws exactly what
trainflow drew before positions (format 1 checkpoints: one block per step).

The position is what a checkpoint's manifest carries (StreamPosition): the next global sample, each source's next
sample, and the ranges the loss guard left out for good (train.guard: a rollback skips the samples of the bad steps,
which still use up their sources' samples, so the same windows never come back). A resume at any dp / tp / pp / cp
or global batch continues from it: no sample twice, none skipped but those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainflow.data.mixture import assign
from trainflow.stream_position import StreamPosition

__all__ = ["DataStream", "StepRows", "StreamPosition", "migrated"]


@dataclass(frozen=True)
class StepRows:
    """The samples one training step takes: global positions [start, end) but the skipped ones, row by row."""

    start: int
    end: int
    sources: np.ndarray
    """(rows,) int64: each row's source, by its index in the stream's names."""
    positions: np.ndarray
    """(rows,) int64: each row's position in its source."""


class DataStream:
    """The stream from a position on: `take` a step's rows, `skip` ranges for good, `position` to save."""

    def __init__(self, position: StreamPosition, *, weights: dict[str, float], seed: int) -> None:
        self.names, self.weights, self.seed = list(weights), list(weights.values()), seed
        self.block, self.samples = position.block, position.samples
        self.counts = np.array([position.sources.get(n, 0) for n in self.names], dtype=np.int64)
        self.skipped = sorted(tuple(r) for r in position.skipped)

    @property
    def position(self) -> StreamPosition:
        sources = dict(zip(self.names, map(int, self.counts)))
        return StreamPosition(self.block, self.samples, sources, [list(r) for r in self.skipped])

    def take(self, rows: int) -> StepRows:
        """The next step's `rows` samples; the stream moves past them (and past any skipped range among them)."""
        step, self.samples, self.counts = self.plan(rows)
        return step

    def peek(self, rows: int) -> StepRows:
        """What take(rows) would give, without moving."""
        return self.plan(rows)[0]

    def skip(self, ranges: Sequence[Sequence[int]]) -> None:
        """Leave these [start, end) ranges of global positions out for good (a rollback's bad steps)."""
        self.skipped = sorted({*self.skipped, *(tuple(r) for r in ranges)})

    def plan(self, rows: int) -> tuple[StepRows, int, np.ndarray]:
        """The rows of the next `rows` samples not skipped, and the position and source counts after them."""
        kept, n = [], self.samples
        while len(kept) < rows:
            if (hole := next((b for a, b in self.skipped if a <= n < b), None)) is not None:
                n = hole
                continue
            edge = min((a for a, _ in self.skipped if a > n), default=n + rows - len(kept))
            take = min(rows - len(kept), edge - n)
            kept.extend(range(n, n + take))
            n += take
        which = assign(self.weights, seed=self.seed, start=self.samples, count=n - self.samples)
        # Every sample up to n uses up its source's next position, the skipped ones too.
        order = np.zeros_like(which)
        counts = self.counts.copy()
        for k in range(len(self.names)):
            mine = which == k
            order[mine] = counts[k] + np.arange(int(mine.sum()))
            counts[k] += int(mine.sum())
        at = np.asarray(kept, dtype=np.int64) - self.samples
        return StepRows(kept[0], kept[-1] + 1, which[at], order[at]), n, counts


def migrated(step: int, windows: Sequence[int], *, batch: int, weights: dict[str, float], seed: int) -> StreamPosition:
    """The position of a format-1 checkpoint of `step`, whose data windows were steps of `batch` samples with the
    windows `windows` (its guard's) left out: each step drew the next window not left out."""
    skipped, window = sorted(windows), step
    for w in skipped:  # ascending: each skipped window at or before the index shifts it on by one
        if w <= window:
            window += 1
    start = StreamPosition.start(block=batch, names=list(weights))
    stream = DataStream(start, weights=weights, seed=seed)
    stream.skip([[w * batch, (w + 1) * batch] for w in skipped])
    stream.samples, stream.counts = window * batch, counts_before(window * batch, weights, seed)
    return stream.position


def counts_before(n: int, weights: dict[str, float], seed: int, chunk: int = 1 << 20) -> np.ndarray:
    """Each source's share of the stream's first n samples (O(n), in chunks: a one-time migration)."""
    counts = np.zeros(len(weights), dtype=np.int64)
    for start in range(0, n, chunk):
        which = assign(list(weights.values()), seed=seed, start=start, count=min(chunk, n - start))
        counts += np.bincount(which, minlength=len(weights))
    return counts
