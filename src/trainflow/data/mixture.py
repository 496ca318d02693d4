"""Which source each sample of the training stream comes from: a pure function of (seed, its global position) and the
sources' weights, so resume, resharding, any data-parallel size and any batch draw the same rows (data.stream).

    python -c "from trainflow.data.mixture import assign; print(assign([0.25, 0.75], seed=0, start=48, count=16))"

Sample n of the stream takes the source whose share of [0, 1) holds
frac(n / phi + c(seed)): a Weyl sequence with the golden ratio, whose first N terms fill every interval within
O(log N) of its share (Weyl's equidistribution, with the golden ratio's least discrepancy). So every stretch of
training gives each source its weight's share of rows, within a few rows, not only on average as independent draws
would (Megatron's blended datasets reach the same by a greedy running count, which needs the count from step 0).
The sequence is computed in 64-bit integers (the multiplier is 2^64 / phi), so it is exact on every machine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainflow.records import Record

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # round(2^64 / phi), odd
SCALE = 1 << 64


def thresholds(weights: Sequence[float]) -> np.ndarray:
    """The upper ends of each source's share of [0, 2^64), as uint64 (the last, 2^64, left implicit)."""
    total, edges, running = sum(weights), [], 0.0
    for w in weights[:-1]:
        running += w
        edges.append(min(int(running / total * SCALE), SCALE - 1))
    return np.array(edges, dtype=np.uint64)


def offset(seed: int) -> np.uint64:
    """The sequence's start for a seed, so runs with different seeds mix their sources in different orders."""
    return np.uint64(int.from_bytes(hashlib.sha256(f"mixture {seed}".encode()).digest()[:8], "little"))


def assign(weights: Sequence[float], *, seed: int, start: int, count: int) -> np.ndarray:
    """The source index of each of the stream's samples start .. start + count - 1, (count,) int64."""
    if len(weights) == 1:
        return np.zeros(count, dtype=np.int64)
    n = np.arange(start, start + count, dtype=np.uint64)
    with np.errstate(over="ignore"):  # the sequence wraps modulo 2^64 by design
        u = n * GOLDEN + offset(seed)
    return np.searchsorted(thresholds(weights), u, side="right").astype(np.int64)


@dataclass(frozen=True)
class SourceShare(Record):
    """One source's part of the tokens a segment trained on (the realised mixture)."""

    name: str
    weight: float
    """Its configured share: weight / the sum of the weights."""
    tokens: int
    """Input tokens of the applied steps' rows it gave."""
    share: float
    """tokens / all the segment's tokens."""


def realised(
    names: Sequence[str], weights: Sequence[float], *, rows: Sequence[Sequence[int]], seq_len: int
) -> list[SourceShare]:
    """The mixture that training steps realised, each step's rows per source given (`rows`, in `names`' order)."""
    counts = np.zeros(len(names), dtype=np.int64)
    for step in rows:
        counts += np.asarray(step, dtype=np.int64)
    total, tokens = max(int(counts.sum()), 1), counts * seq_len
    return [
        SourceShare(name, w / sum(weights), int(t), int(c) / total)
        for name, w, t, c in zip(names, weights, tokens, counts)
    ]
