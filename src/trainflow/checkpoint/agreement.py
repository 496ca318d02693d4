"""What the ranks of a single read (checkpoint.single_read) tell each other before any byte of the checkpoint moves:
whether every rank's reads passed their checks, then, between each file's reader and the ranks that need that file
only, its records and shared memory, the ranges they ask for and the pieces the reader will send.

    python -m pytest tests/unit/test_single_read.py -k agreement

An all_gather_object of every rank's descriptions and asks handed every rank every file's records and every rank's
asks: at the seed's 4096 ranks and 8192 files, MBs from each of 4096 ranks. Here the verdict is one all_reduce of the
lowest failing rank (a tensor of one number), then that rank's error broadcast to all, so every rank raises the same
error before any byte is exchanged or loaded. The rest passes point-to-point between a file's reader and its
receivers, whom each rank's plan names (checkpoint.load_plan's RankShares): the reader tells each receiver the records
and the shared-memory address of the files it needs (`described_to`), each receiver tells the reader the ranges it
asks for (`asks_to`, checkpoint.landing), and the reader tells each receiver the pieces it will send it, each with its
round (`pieces_to`, checkpoint.exchange_rounds), so a rank knows only the pieces it takes part in and both ends of a
piece know the phase it travels in. What a rank sends and receives follows its own shares, whatever the world's size.
The messages are pickled: they pass between the ranks of one job, as all_gather_object's did; nothing read from the
run folder is unpickled here.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from trainflow.checkpoint.exchange_rounds import Piece, Ranges, pieces
from trainflow.checkpoint.host_shared import Address
from trainflow.checkpoint.load_plan import FileShare, Incoming
from trainflow.checkpoint.tensor_record import SavedTensor


@dataclass(frozen=True)
class Described:
    """What a file's reader tells each rank that needs the file: its records by offset (None: not described,
    checkpoint.tensor_record) and where that rank may map its bytes (None: nowhere, checkpoint.host_shared)."""

    records: dict[int, SavedTensor | None]
    address: Address | None


def raise_first_failure(error: Exception | None, *, group: dist.ProcessGroup | None, device: torch.device) -> None:
    """Raise on every rank of `group` the error of the lowest rank that has one (a collective: one number reduced,
    one error broadcast where there is one); return where no rank has one."""
    size = dist.get_world_size(group)
    lowest = torch.tensor([size if error is None else dist.get_rank(group)], device=device)
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN, group=group)
    if (failed := int(lowest)) < size:
        message = [error]
        dist.broadcast_object_list(message, group=group, group_src=failed, device=device)
        raise message[0]


def described_to(
    reads: Iterable[FileShare], described: dict[str, dict], addresses: dict[str, Address]
) -> dict[int, dict[str, Described]]:
    """What the reader of `reads` tells each of their receivers (by rank) of each file it needs (by name): the file's
    records (`described`, by file) and shared memory (`addresses`, by file, where it has some)."""
    out: dict[int, dict[str, Described]] = {}
    for share in reads:
        for r in share.receivers:
            out.setdefault(r, {})[share.name] = Described(described[share.name], addresses.get(share.name))
    return out


def asks_to(incoming: Iterable[Incoming], ranges: Ranges) -> dict[int, Ranges]:
    """What a rank asks each reader (by rank) of its `incoming` files for: `ranges`, by file (none where it maps it)."""
    out: dict[int, Ranges] = {}
    for x in incoming:
        out.setdefault(x.reader, {})[x.name] = ranges.get(x.name, [])
    return out


def pieces_to(
    reads: tuple[FileShare, ...], asked: dict[int, Ranges], round_bytes: int
) -> tuple[list[Piece], dict[int, list[Piece]]]:
    """The pieces of the files a rank reads (`reads`), from its receivers' asks (`asked`, by rank), and those it tells
    each receiver (by rank), the pieces it takes part in (an empty list where none)."""
    mine = pieces(reads, asked, round_bytes)
    out: dict[int, list[Piece]] = {r: [] for share in reads for r in share.receivers}
    for p in mine:
        for r in p.members[1:]:
            out[r].append(p)
    return mine, out


def exchanged(
    outgoing: dict[int, object], sources: list[int], *, group: dist.ProcessGroup | None, device: torch.device
) -> dict[int, object]:
    """Send each rank of `group` in `outgoing` its object and receive one from each of `sources`, by rank: pickled,
    their sizes then their bytes, each a set of point-to-point messages posted one at a time in one order on every rank
    (by sender, then receiver), so no two ranks wait on each other in a cycle, and waited for. The messages are small;
    on NCCL each waits for those before it at both its ends, a chain of ~N^2 latencies in a dp group of N (the exchange
    of the bytes runs in phases instead, checkpoint.exchange_rounds): not yet measured."""
    data = {r: torch.frombuffer(bytearray(pickle.dumps(x)), dtype=torch.uint8).to(device) for r, x in outgoing.items()}
    sizes = {r: torch.zeros(1, dtype=torch.int64, device=device) for r in sources}
    posted(
        {r: torch.tensor([t.numel()], dtype=torch.int64, device=device) for r, t in data.items()}, sizes, group=group
    )
    into = {r: torch.empty(int(n), dtype=torch.uint8, device=device) for r, n in sizes.items()}
    posted(data, into, group=group)
    return {r: pickle.loads(t.cpu().numpy().tobytes()) for r, t in into.items()}


def posted(sends: dict[int, torch.Tensor], receives: dict[int, torch.Tensor], *, group: dist.ProcessGroup | None):
    """Send each tensor of `sends` to its rank and receive each of `receives` from its rank, then wait for them all."""
    me = dist.get_rank(group)
    ops = {(me, r): partial(dist.isend, t, group=group, group_dst=r) for r, t in sends.items()}
    ops |= {(r, me): partial(dist.irecv, t, group=group, group_src=r) for r, t in receives.items()}
    for work in [ops[key]() for key in sorted(ops)]:
        work.wait()
