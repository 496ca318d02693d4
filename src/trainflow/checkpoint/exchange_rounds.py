"""The exchange of a single read (checkpoint.single_read): each file's bytes sent by the rank that read it to the
ranks that asked for them, in phases that run between disjoint pairs at once, in rounds of bounded memory.

    python -m pytest tests/unit/test_exchange_rounds.py

Megatron-Core's fully parallel load broadcasts each share inside the dp group; here the reader sends each piece
point-to-point to the ranks that asked for it (those that cannot map the reader's memory, checkpoint.host_shared),
inside the load's own group: no process group is made, so no rank needs to know any group but its own files' (a
broadcast group per set of receivers was a new_group that every rank of the world had to make, from every rank's
pieces; gloo hangs making overlapping groups each among its own ranks). The cost: a reader sends each byte once per
receiver, where NCCL's ring broadcast has each receiver pass it on; a rank's bytes sent are then what it puts on the
wire, and where every rank reads its share of files that its peers need, each sends what each receives ((N - 1)/N of
them in a group of N), as in a ring. A file's bytes travel as pieces: the union of its receivers' asked ranges
(checkpoint.landing), cut at half a round, which the reader puts in rounds of at most half a round, in file and offset
order (checkpoint.agreement tells each receiver its pieces, each with its round). A piece lands on each receiver
straight in its place: in the destination tensor (in place) or in the buffer of the record it is part of; into a
phase's scratch only where it is not one landing's alone.

The schedule is a tournament's round-robin: in phase (j, k) each rank sends the pieces of its round j that the rank k
after it in the group (mod its size) asked for, and receives those of round j of the rank k before it, so a phase has
each rank send to one rank and receive from one, every link busy at once. Where each rank of N reads 1/N of the files
and all need them, the exchange takes N - 1 phases of a file each; one global order of messages (by file, offset,
receiver), each waiting on NCCL's stream for those before it at both its ends, took O(N^2) (2924 file-times against
63 at N = 64, tests/unit/test_exchange_rounds.py). Both ends of a message know its phase from the piece (its reader and
round) and the group's size. Every rank goes through its phases in one order (round, then distance), posts a phase's
sends and receives at once (batch_isend_irecv: NCCL runs them as one group, so a ring of sends does not wait on the
receives behind it) and waits for them before the next; a phase's partners are in that same phase, having finished
their earlier ones, so no two ranks wait on each other in a cycle. After each phase a rank loads the records it
completed and frees their memory: it holds the device copies of the round it sends and what the phase brings it
(scratch, record buffers), at most half a round each, or a record where one bigger than half a round does not land in
place (its buffer lives from its first piece to its last, through the phases between).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainflow.checkpoint.landing import Landing
from trainflow.checkpoint.load_plan import FileShare

ROUND_BYTES = 256 << 20
"""A round's extra memory per rank (half for the round it sends, half for what it receives): ~0.3 % of an 80 GB GPU;
a 70B model's fp32 embedding (128256 x 8192, 4.2 GB) moves in 34 rounds. What a phase costs in time on NVLink or
InfiniBand: not yet measured."""

Ranges = dict[str, list[tuple[int, int]]]
"""By file: the (start, nbytes) ranges of it one rank asks for."""


@dataclass(frozen=True)
class Piece:
    """Bytes [start, start + nbytes) of the file `name`, sent by members[0], its reader, to each of the rest, in the
    reader's round `round`."""

    name: str
    start: int
    nbytes: int
    members: tuple[int, ...]
    round: int


@dataclass
class Tally:
    """What a rank's exchange moved and held: bytes it sent (once per receiver) and received, the rounds and phases it
    took part in, and the peak of its extra memory (device copies, scratch, record buffers)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    rounds: int = 0
    phases: int = 0
    peak_bytes: int = 0
    live: int = field(default=0, repr=False)

    def hold(self, n: int) -> None:
        self.live += n
        self.peak_bytes = max(self.peak_bytes, self.live)


def pieces(reads: Iterable[FileShare], asked: dict[int, Ranges], round_bytes: int) -> list[Piece]:
    """The pieces of the files one rank reads (`reads`), from the ranges its receivers ask for (`asked`, by rank): the
    union of each file's overlapping ranges (one record's, in practice) cut at half of `round_bytes`, each to the
    receivers whose ranges it overlaps, by file then offset, in rounds of at most half of `round_bytes`."""
    half, out, round_, filled = max(1, round_bytes // 2), [], 0, 0
    for share in sorted(reads, key=lambda s: s.name):
        ranges = {r: asked.get(r, {}).get(share.name, ()) for r in share.receivers}
        merged: list[list[int]] = []
        for start, n in sorted(x for xs in ranges.values() for x in xs):
            if merged and start < merged[-1][1]:  # overlapping asks; touching ones (two records) stay apart
                merged[-1][1] = max(merged[-1][1], start + n)
            else:
                merged.append([start, start + n])
        for start, end in merged:
            for at in range(start, end, half):
                n = min(half, end - at)
                to = tuple(r for r, xs in ranges.items() if any(s < at + n and at < s + k for s, k in xs))
                if filled and filled + n > half:
                    round_, filled = round_ + 1, 0
                filled += n
                out.append(Piece(share.name, at, n, (share.reader, *to), round_))
    return out


@dataclass
class Phase:
    """One phase of a rank's exchange: the pieces of round `round` it sends to the rank `distance` after it in the
    group and those it receives from the rank `distance` before it, each by file then offset (the order both ends of
    a pair list them in, so their messages match)."""

    round: int
    distance: int
    sends: list[Piece] = field(default_factory=list)
    receives: list[Piece] = field(default_factory=list)


def phases(mine: Iterable[Piece], rank: int, size: int) -> list[Phase]:
    """The phases of rank `rank` of a group of `size` that sends and receives `mine` (the pieces it is a member of),
    in the order every rank goes through them: by round, then distance (the module's docstring)."""
    out: dict[tuple[int, int], Phase] = {}
    for p in sorted(mine, key=lambda p: (p.name, p.start)):
        reader = p.members[0]
        if reader == rank:
            for r in p.members[1:]:
                k = (r - rank) % size
                out.setdefault((p.round, k), Phase(p.round, k)).sends.append(p)
        elif rank in p.members:
            k = (rank - reader) % size
            out.setdefault((p.round, k), Phase(p.round, k)).receives.append(p)
    return [out[key] for key in sorted(out)]


@dataclass
class Pending:
    """One piece a phase receives: the tensor it is received into, the extra bytes that tensor holds until the phase
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
    """One rank's side of the exchange (point-to-point messages between the `size` ranks of `group`, its own rank
    `rank`), in the rounds its pieces carry; `loaded(name, landing)` loads a landing once all its bytes are here."""

    def __init__(
        self,
        rank: int,
        size: int,
        *,
        device: torch.device,
        group: dist.ProcessGroup | None,
        loaded: Callable[[str, Landing], None],
    ) -> None:
        self.rank, self.size, self.device, self.group, self.loaded = rank, size, device, group, loaded
        self.tally = Tally()

    def run(self, held: dict[str, torch.Tensor], landings: dict[str, list[Landing]], mine: list[Piece]) -> None:
        """Send the pieces of `held` (the files this rank read) and receive those of `landings` (by file): `mine`, the
        pieces this rank is a member of, a phase at a time."""
        self.names = {id(x): name for name, ls in landings.items() for x in ls}
        self.left = {  # the pieces each landing waits for
            id(x): sum(p.name == name and overlap(p, x) for p in mine) for name, ls in landings.items() for x in ls
        }
        # A piece goes to the device once, at the first phase that sends it, and its copy stays until this rank's
        # first phase of a later round: a round's phases come one after another in every rank's order, so the copies
        # held at once are one round's, at most half of round_bytes (pieces puts the pieces in rounds).
        copies: dict[Piece, torch.Tensor] = {}
        schedule = phases(mine, self.rank, self.size)
        self.tally.rounds += len({phase.round for phase in schedule})
        for phase in schedule:
            if copies and next(iter(copies)).round != phase.round:
                self.release(copies)
            to, source = (self.rank + phase.distance) % self.size, (self.rank - phase.distance) % self.size
            ops = [self.op(dist.isend, self.copy(p, held, copies), to) for p in phase.sends]
            pending = [self.staged(p, landings) for p in phase.receives]
            ops += [self.op(dist.irecv, b.data, source) for b in pending]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            self.finish(pending)
        self.release(copies)

    def op(self, fn: Callable, data: torch.Tensor, peer: int) -> dist.P2POp:
        return dist.P2POp(fn, data, group=self.group, group_peer=peer)

    def copy(self, p: Piece, held: dict[str, torch.Tensor], copies: dict[Piece, torch.Tensor]) -> torch.Tensor:
        """Piece `p` of a file this rank read, on the device (a slice of the file where the exchange runs on the CPU),
        counted as sent once per phase that sends it."""
        if p not in copies:
            copies[p] = held[p.name][p.start : p.start + p.nbytes].to(self.device)
            self.tally.hold(p.nbytes * (self.device.type != "cpu"))
        self.tally.bytes_sent += p.nbytes
        return copies[p]

    def release(self, copies: dict[Piece, torch.Tensor]) -> None:
        self.tally.live -= sum(p.nbytes for p in copies) * (self.device.type != "cpu")
        copies.clear()

    def staged(self, p: Piece, landings: dict[str, list[Landing]]) -> Pending:
        """The tensor piece `p` is received into: its place here, else scratch."""
        dests = [x for x in landings.get(p.name, ()) if x.nbytes and overlap(p, x)]
        for x in dests:
            if x.into is None:  # a record's buffer, made when its first piece comes
                x.into = torch.empty(x.nbytes, dtype=torch.uint8, device=self.device)
                self.tally.hold(x.nbytes)
        if direct(p, dests):
            x = dests[0]
            data, extra = x.into[p.start - x.start : p.start - x.start + p.nbytes], 0
        else:
            data, extra = torch.empty(p.nbytes, dtype=torch.uint8, device=self.device), p.nbytes
        self.tally.bytes_received += p.nbytes
        self.tally.hold(extra)
        return Pending(p, data, extra, dests, scratch=not direct(p, dests))

    def finish(self, pending: list[Pending]) -> None:
        """After a phase's messages: copy its scratch into place, load the landings it completed, free."""
        self.tally.phases += 1
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
