"""Who reads which file of a checkpoint, and each rank's own part of that plan (checkpoint.single_read).

    python -m pytest tests/unit/test_single_read.py -k plan

DCP's coordinator plans the load from every rank's plan and hands each rank its own back, pickled: a rank's plan once
carried the whole schedule (8192 files at the seed's 4096 ranks: 1.9 MB a plan, 7.9 GB pickled by rank 0 per load).
Here a rank's plan holds only its own shares: the files it reads and the ranks that need each, the files it needs from
another rank's read and who reads them. Its size follows the rank's own shares (under data parallelism, its files and
its dp peers), not the world's size. Torch-free: the planning is plain Python, tested at the seed's scale.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FileShare:
    """One file of the checkpoint in the load's schedule: its path relative to the checkpoint folder, its bytes, the
    rank that reads it whole and checks it, and the other ranks whose plans read from it (none: only its reader needs
    it, or no rank does and it is read to be checked)."""

    name: str
    bytes: int
    reader: int
    receivers: tuple[int, ...]


@dataclass(frozen=True)
class Incoming:
    """One file another rank reads that this rank's plan reads from: its path and the rank that reads it."""

    name: str
    reader: int


@dataclass(frozen=True)
class RankShares:
    """One rank's part of the load's schedule: what it reads, what it has from other ranks' reads."""

    reads: tuple[FileShare, ...]
    incoming: tuple[Incoming, ...]

    def receivers(self) -> list[int]:
        """The ranks that need a file this rank reads: those it tells about them (checkpoint.agreement)."""
        return sorted({r for s in self.reads for r in s.receivers})

    def readers(self) -> list[int]:
        """The ranks that read a file this rank needs: those it hears from."""
        return sorted({s.reader for s in self.incoming})


def schedule(files: dict[str, int], needs: dict[str, set[int]], ranks: int) -> list[FileShare]:
    """Who reads each of `files` (relative path -> bytes), given the ranks whose plans read from each (`needs`):
    largest first, to the needing rank with the fewest bytes so far (any rank where none needs it)."""
    load = [0] * ranks
    out = []
    for name in sorted(files, key=lambda n: (-files[n], n)):
        who = sorted(needs.get(name, ())) or range(ranks)
        reader = min(who, key=lambda r: (load[r], r))
        load[reader] += files[name]
        out.append(FileShare(name, files[name], reader, tuple(r for r in who if r != reader and name in needs)))
    return out


def rank_plans(files: dict[str, int], needs: dict[str, set[int]], ranks: int) -> list[RankShares]:
    """Each rank's own shares of schedule(files, needs, ranks), by rank."""
    reads: list[list[FileShare]] = [[] for _ in range(ranks)]
    incoming: list[list[Incoming]] = [[] for _ in range(ranks)]
    for share in schedule(files, needs, ranks):
        reads[share.reader].append(share)
        for r in share.receivers:
            incoming[r].append(Incoming(share.name, share.reader))
    return [RankShares(tuple(reads[r]), tuple(incoming[r])) for r in range(ranks)]
