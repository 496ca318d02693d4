"""The exchange of a single read (checkpoint.single_read): each file's bytes sent by the rank that read it to the
ranks that asked for them, in rounds of bounded memory.

    python -m pytest tests/unit/test_single_read.py -k round

Megatron-Core's fully parallel load broadcasts each share inside the dp group; here the reader sends each piece
point-to-point to the ranks that asked for it (those that cannot map the reader's memory, checkpoint.host_shared),
inside the load's own group: no process group is made, so no rank needs to know any group but its own files' (a
broadcast group per set of receivers was a new_group that every rank of the world had to make, from every rank's
pieces; gloo hangs making overlapping groups each among its own ranks). The cost: a reader sends each byte once per
receiver, where NCCL's ring broadcast has each receiver pass it on; a rank's bytes sent are then what it puts on the
wire, and where every rank reads its share of files that its peers need, each sends what each receives ((N - 1)/N of
them in a group of N), as in a ring. A file's bytes travel as pieces: the union of its receivers' asked ranges
(checkpoint.landing), cut at ROUND_BYTES, each sent to the receivers whose ranges it overlaps (the reader forms them,
checkpoint.agreement). Each piece moves to the device once on the reader (a slice of the file it read, where the
exchange runs on the CPU) and lands on each receiver straight in its place: in the destination tensor (in place) or in
the buffer of the record it is part of; into a round's scratch only where it is not one landing's alone. Every rank
issues its sends and receives one at a time in one global order (by file, then offset, then receiver), which both
ends of each message share, so no two ranks wait on each other in a cycle whatever their rounds (a fused batch,
batch_isend_irecv, would let NCCL serve its peers in an order of its own). A rank waits for a round's messages, loads
the records they completed and frees their memory before it issues the next round: the extra memory it holds (device
copies, scratch, record buffers) stays under one round, or one record where a record is bigger (torch.load reads a
record from one buffer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainflow.checkpoint.landing import Landing
from trainflow.checkpoint.load_plan import FileShare

ROUND_BYTES = 256 << 20
"""A round's extra memory per rank: ~0.3 % of an 80 GB GPU; a 70B model's fp32 embedding (128256 x 8192, 4.2 GB)
moves in 17 rounds. What a round costs in time on NVLink or InfiniBand: not yet measured."""

Ranges = dict[str, list[tuple[int, int]]]
"""By file: the (start, nbytes) ranges of it one rank asks for."""


@dataclass(frozen=True)
class Piece:
    """Bytes [start, start + nbytes) of the file `name`, sent by members[0], its reader, to each of the rest."""

    name: str
    start: int
    nbytes: int
    members: tuple[int, ...]


@dataclass
class Tally:
    """What a rank's exchange moved and held: bytes it sent (once per receiver) and received, rounds, and the peak of
    its extra memory (device copies, scratch, record buffers)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    rounds: int = 0
    peak_bytes: int = 0
    live: int = field(default=0, repr=False)

    def hold(self, n: int) -> None:
        self.live += n
        self.peak_bytes = max(self.peak_bytes, self.live)


def pieces(reads: Iterable[FileShare], asked: dict[int, Ranges], round_bytes: int) -> list[Piece]:
    """The pieces of the files one rank reads (`reads`), from the ranges its receivers ask for (`asked`, by rank): the
    union of each file's overlapping ranges (one record's, in practice) cut at `round_bytes`, each to the receivers
    whose ranges it overlaps, in the order every rank issues them (by file, then offset)."""
    out = []
    for share in sorted(reads, key=lambda s: s.name):
        ranges = {r: asked.get(r, {}).get(share.name, ()) for r in share.receivers}
        merged: list[list[int]] = []
        for start, n in sorted(x for xs in ranges.values() for x in xs):
            if merged and start < merged[-1][1]:  # overlapping asks; touching ones (two records) stay apart
                merged[-1][1] = max(merged[-1][1], start + n)
            else:
                merged.append([start, start + n])
        for start, end in merged:
            for at in range(start, end, round_bytes):
                n = min(round_bytes, end - at)
                to = tuple(r for r, xs in ranges.items() if any(s < at + n and at < s + k for s, k in xs))
                out.append(Piece(share.name, at, n, (share.reader, *to)))
    return out


@dataclass
class Pending:
    """One piece of a round: the tensor it is sent from or received into, the extra bytes that tensor holds until
    the round ends, and the landings it brings bytes to (copied out of `data` where it is scratch)."""

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
    """One rank's side of the exchange (point-to-point messages between the ranks of `group`, its own rank `rank`),
    `round_bytes` of extra memory a round; `loaded(name, landing)` loads a landing once all its bytes are here."""

    def __init__(
        self,
        rank: int,
        *,
        device: torch.device,
        group: dist.ProcessGroup | None,
        loaded: Callable[[str, Landing], None],
        round_bytes: int = ROUND_BYTES,
    ) -> None:
        self.rank, self.device, self.group, self.loaded = rank, device, group, loaded
        self.round_bytes, self.tally = round_bytes, Tally()

    def run(self, held: dict[str, torch.Tensor], landings: dict[str, list[Landing]], mine: list[Piece]) -> None:
        """Send the pieces of `held` (the files this rank read) and receive those of `landings` (by file): `mine`, the
        pieces this rank is a member of, in order, a round at a time."""
        self.names = {id(x): name for name, ls in landings.items() for x in ls}
        self.left = {  # the pieces each landing waits for
            id(x): sum(p.name == name and overlap(p, x) for p in mine) for name, ls in landings.items() for x in ls
        }
        works: list[dist.Work] = []
        pending: list[Pending] = []
        for p in mine:
            sender = p.members[0] == self.rank
            dests = [] if sender else [x for x in landings.get(p.name, ()) if x.nbytes and overlap(p, x)]
            if pending and self.tally.live + self.cost(p, dests) > self.round_bytes:
                self.finish(works, pending)
                works, pending = [], []
            pending.append(self.staged(p, held, dests))
            data = pending[-1].data
            if sender:  # one at a time, in the module's global order (its docstring says why no batch)
                works += [dist.isend(data, group=self.group, group_dst=r) for r in p.members[1:]]
            else:
                works.append(dist.irecv(data, group=self.group, group_src=p.members[0]))
        self.finish(works, pending)

    def cost(self, p: Piece, dests: list[Landing]) -> int:
        """The extra bytes piece `p` makes this rank hold: a device copy on its reader; new record buffers and any
        scratch on a receiver."""
        if p.members[0] == self.rank:
            return p.nbytes * (self.device.type != "cpu")
        return sum(x.nbytes for x in dests if x.into is None) + p.nbytes * (not direct(p, dests))

    def staged(self, p: Piece, held: dict[str, torch.Tensor], dests: list[Landing]) -> Pending:
        """The tensor piece `p` is sent from (its reader's bytes, on the device) or received into (its place here)."""
        if p.members[0] == self.rank:
            data = held[p.name][p.start : p.start + p.nbytes].to(self.device)
            extra = data.nbytes * (self.device.type != "cpu")
            self.tally.bytes_sent += p.nbytes * (len(p.members) - 1)
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
        """Wait for a round's messages, copy its scratch into place, load the landings it completed, free."""
        for work in works:
            work.wait()
        self.tally.rounds += bool(pending)
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
