"""The exchange of a single read (checkpoint.single_read): each file's bytes broadcast by the rank that read it to the
ranks that asked for them, in rounds of bounded memory.

    python -m pytest tests/unit/test_single_read.py -k round

Megatron-Core's fully parallel load broadcasts each share inside the dp group, on the device; so does this. A file's
broadcast group is its reader and the ranks that ask for its bytes (those that cannot map the reader's memory,
checkpoint.host_shared): in practice a dp group. Its bytes travel as pieces: the union of every member's asked ranges
(checkpoint.landing), cut at ROUND_BYTES. Each piece moves to the device once on the reader (a slice of the file it
read, where the exchange runs on the CPU) and lands on each receiver straight in its place: in the destination tensor
(in place) or in the buffer of the record it is part of; into a round's scratch only where it is not one landing's
alone. Every rank issues its broadcasts in one order (by file, then offset), so groups that share ranks never wait on
each other. A rank waits for a round's broadcasts, loads the records they completed and frees their memory before it
issues the next round: the extra memory it holds (device copies, scratch, record buffers) stays under one round, or
one record where a record is bigger (torch.load reads a record from one buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainflow.checkpoint.landing import Landing

ROUND_BYTES = 256 << 20
"""A round's extra memory per rank: ~0.3 % of an 80 GB GPU; a 70B model's fp32 embedding (128256 x 8192, 4.2 GB)
moves in 17 rounds. What a round costs in time on NVLink or InfiniBand: not yet measured."""

Ranges = dict[str, list[tuple[int, int]]]
"""By file: the (start, nbytes) ranges of it one rank asks for."""


@dataclass(frozen=True)
class Piece:
    """Bytes [start, start + nbytes) of the file `name`, broadcast by members[0], its reader, to the rest."""

    name: str
    start: int
    nbytes: int
    members: tuple[int, ...]


@dataclass
class Tally:
    """What a rank's exchange moved and held: bytes it broadcast and received, rounds, and the peak of its extra
    memory (device copies, scratch, record buffers)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    rounds: int = 0
    peak_bytes: int = 0
    live: int = field(default=0, repr=False)

    def hold(self, n: int) -> None:
        self.live += n
        self.peak_bytes = max(self.peak_bytes, self.live)


def pieces(readers: dict[str, int], asked: list[Ranges], round_bytes: int) -> list[Piece]:
    """Every piece of the files in `readers` (name -> reader), from every rank's asks (`asked`, by rank): the union of
    each file's overlapping ranges (one record's, in practice), cut at `round_bytes`, in the order every rank issues
    them."""
    out = []
    for name in sorted(readers):
        askers = tuple(r for r, ranges in enumerate(asked) if r != readers[name] and ranges.get(name))
        merged: list[list[int]] = []
        for start, n in sorted(x for r in askers for x in asked[r][name]):
            if merged and start < merged[-1][1]:  # overlapping asks; touching ones (two records) stay apart
                merged[-1][1] = max(merged[-1][1], start + n)
            else:
                merged.append([start, start + n])
        for start, end in merged:
            for at in range(start, end, round_bytes):
                out.append(Piece(name, at, min(round_bytes, end - at), (readers[name], *askers)))
    return out


class BroadcastGroups:
    """The process groups of the pieces' members, ranks of `parent` (None: the default group): `parent` where they
    are all of it, else one of them alone, made once and kept for the next load. Every rank of the world makes every
    group (new_group): gloo here hangs making overlapping groups each by its own ranks (use_local_synchronization),
    and the pieces of every rank are known to each after the asks are gathered; so a load on a `parent` smaller than
    the world whose files need smaller groups than `parent` waits on the ranks outside it."""

    def __init__(self, parent: dist.ProcessGroup | None) -> None:
        self.parent, self.made = parent, {}

    def made_for(self, every: list[Piece]) -> None:
        """Make the groups of `every` piece of the load, in one order on every rank (each a collective)."""
        for members in sorted({tuple(sorted(p.members)) for p in every}):
            self(members)

    def __call__(self, members: tuple[int, ...]) -> tuple[dist.ProcessGroup | None, int]:
        """The group of `members` and the global rank of the first (which broadcasts)."""
        to_global = (lambda r: r) if self.parent is None else (lambda r: dist.get_global_rank(self.parent, r))
        if len(members) == dist.get_world_size(self.parent):
            return self.parent, to_global(members[0])
        key = tuple(sorted(members))
        if key not in self.made:
            self.made[key] = dist.new_group([to_global(r) for r in key])
        return self.made[key], to_global(members[0])


@dataclass
class Pending:
    """One broadcast of a round: its piece, the tensor it moves, the extra bytes that tensor holds until the round
    ends, and the landings it brings bytes to (copied out of `data` where it is scratch)."""

    piece: Piece
    data: torch.Tensor
    extra: int
    dests: list[Landing]
    scratch: bool


def overlap(p: Piece, x: Landing) -> bool:
    return p.start < x.start + x.nbytes and x.start < p.start + p.nbytes


def direct(p: Piece, dests: list[Landing]) -> bool:
    """Whether piece `p` lands straight in its one landing (else in scratch, copied into each)."""
    return len(dests) == 1 and dests[0].start <= p.start and p.start + p.nbytes <= dests[0].start + dests[0].nbytes


class RoundExchange:
    """One rank's side of the broadcasts (a collective over each piece's members: `group_of(members)` is their group
    and the reader's global rank), `round_bytes` of extra memory a round; `loaded(name, landing)` loads a landing once
    all its bytes are here."""

    def __init__(
        self,
        rank: int,
        *,
        device: torch.device,
        group_of: Callable[[tuple[int, ...]], tuple[dist.ProcessGroup | None, int]],
        loaded: Callable[[str, Landing], None],
        round_bytes: int = ROUND_BYTES,
    ) -> None:
        self.rank, self.device, self.group_of, self.loaded = rank, device, group_of, loaded
        self.round_bytes, self.tally = round_bytes, Tally()

    def run(self, held: dict[str, torch.Tensor], landings: dict[str, list[Landing]], mine: list[Piece]) -> None:
        """Broadcast the pieces of `held` (the files this rank read) and receive those of `landings` (by file): `mine`,
        the pieces this rank is a member of, in order, a round at a time."""
        self.names = {id(x): name for name, ls in landings.items() for x in ls}
        self.left = {  # the pieces each landing waits for
            id(x): sum(p.name == name and overlap(p, x) for p in mine) for name, ls in landings.items() for x in ls
        }
        works: list[dist.Work] = []
        pending: list[Pending] = []
        for p in mine:
            sender = p.members[0] == self.rank
            dests = [] if sender else [x for x in landings.get(p.name, ()) if x.nbytes and overlap(p, x)]
            if works and self.tally.live + self.cost(p, dests) > self.round_bytes:
                self.finish(works, pending)
                works, pending = [], []
            pending.append(self.staged(p, held, dests))
            group, src = self.group_of(p.members)
            works.append(dist.broadcast(pending[-1].data, src=src, group=group, async_op=True))
        self.finish(works, pending)

    def cost(self, p: Piece, dests: list[Landing]) -> int:
        """The extra bytes piece `p` makes this rank hold: a device copy on its reader; new record buffers and any
        scratch on a receiver."""
        if p.members[0] == self.rank:
            return p.nbytes * (self.device.type != "cpu")
        return sum(x.nbytes for x in dests if x.into is None) + p.nbytes * (not direct(p, dests))

    def staged(self, p: Piece, held: dict[str, torch.Tensor], dests: list[Landing]) -> Pending:
        """The tensor piece `p` is broadcast from (its reader's bytes, on the device) or into (its place here)."""
        if p.members[0] == self.rank:
            data = held[p.name][p.start : p.start + p.nbytes].to(self.device)
            extra = data.nbytes * (self.device.type != "cpu")
            self.tally.bytes_sent += p.nbytes
        else:
            for x in dests:
                if x.into is None:  # a record's buffer, made when its first piece comes
                    x.into = torch.empty(x.nbytes, dtype=torch.uint8, device=self.device)
                    self.tally.hold(x.nbytes)
            if direct(p, dests):
                x = dests[0]
                data, extra = x.into[p.start - x.start : p.start - x.start + p.nbytes], 0
            else:
                data = torch.empty(p.nbytes, dtype=torch.uint8, device=self.device)
                extra = p.nbytes
            self.tally.bytes_received += p.nbytes
        self.tally.hold(extra)
        return Pending(p, data, extra, dests, scratch=not direct(p, dests))

    def finish(self, works: list[dist.Work], pending: list[Pending]) -> None:
        """Wait for a round's broadcasts, copy its scratch into place, load the landings it completed, free."""
        for work in works:
            work.wait()
        self.tally.rounds += bool(works)
        for b in pending:
            for x in b.dests:
                if b.scratch:
                    lo, hi = max(b.piece.start, x.start), min(b.piece.start + b.piece.nbytes, x.start + x.nbytes)
                    x.into[lo - x.start : hi - x.start].copy_(b.data[lo - b.piece.start : hi - b.piece.start])
                self.left[id(x)] -= 1
                if not self.left[id(x)]:
                    self.loaded(self.names[id(x)], x)
                    if not x.in_place:
                        self.tally.live -= x.nbytes
                        x.into = None
            self.tally.live -= b.extra
