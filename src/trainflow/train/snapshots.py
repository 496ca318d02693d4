"""Peer snapshots (checkpoint.snapshot_steps, under resilience.recovery=peers): every few steps each rank copies its
state into its own host memory and sends a copy to its partner, the rank of the same local index on the next node (in
another failure domain); it holds its ward's (the previous node's) in turn. Where a failure takes every live replica
of a shard (a layout without data-parallel replicas, or both replicas' nodes), the recovery from peers restores the
lost ranks from their partners' copies and every survivor from its own, all at the snapshot's step: at most
snapshot_steps steps lost, no checkpoint file read (launch.peer_recovery plans it).

    snapshots = PeerSnapshots(every=2, rank=rank, world=world, per_node=2)
    if snapshots.due(step): snapshots.take(trainer)      # Trainer.train, at a step's start

A snapshot is taken at the step's start, after its boundary (train.peer_state.Boundary) is marked: the tensors copied
to host memory, then exchanged with the partner and the ward in one batch of point-to-point sends and receives, each
tensor checked against its sender's CRC-32C. The copy to host memory blocks the step; so does the exchange here (gloo
runs it at the training network's speed; a background exchange on a group of its own is not built). Host memory per
rank: twice its state (its own copy and its ward's), which plan.peers counts.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainflow.train.peer_state import (
    HEADER_BYTES,
    KeptState,
    PeerHeader,
    PeerStateError,
    as_bytes,
    state_tensors,
    tensor_crc,
)

log = logging.getLogger(__name__)


@dataclass
class PeerSnapshots:
    every: int
    rank: int
    world: int
    per_node: int
    own: KeptState | None = None
    """This rank's newest snapshot (its tensors in host memory, in its own shapes)."""
    held: KeptState | None = None
    """The ward's newest snapshot, as bytes (the ward may hold another pipeline stage's tensors)."""

    @property
    def partner(self) -> int:
        return (self.rank + self.per_node) % self.world

    @property
    def ward(self) -> int:
        return (self.rank - self.per_node) % self.world

    def steps(self) -> tuple[int, int]:
        """The steps of its own snapshot and of the one it holds (-1: none)."""
        return (self.own.boundary.step if self.own else -1, self.held.boundary.step if self.held else -1)

    def due(self, step: int) -> bool:
        """Every `every` steps, from the first after step 0: a fresh optimizer has no state to copy yet, and reading
        it would make some (a zero step: checkpoint.state.state_bytes), changing the run."""
        return bool(self.every) and step > 0 and step % self.every == 0

    def take(self, trainer: object) -> None:
        """Snapshot the trainer's state at its current step's start, and exchange copies with partner and ward."""
        tensors = {k: t.detach().to("cpu", copy=True) for k, t in state_tensors(trainer.ckpt.state()).items()}
        own = KeptState(trainer.boundary, tensors)
        held = self.exchange(own)
        self.own, self.held = own, held

    def exchange(self, own: KeptState) -> KeptState:
        """Send `own` to the partner and receive the ward's, in one batch per phase (sizes, headers, tensors)."""
        crcs = {k: [t.nbytes, tensor_crc(t)] for k, t in own.tensors.items()}
        header = json.dumps(PeerHeader(own.boundary, crcs).to_json()).encode()
        size, theirs = torch.tensor([len(header)], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        batch([(size, self.partner)], [(theirs, self.ward)])
        if not 0 < int(theirs) <= HEADER_BYTES:
            raise PeerStateError(f"rank {self.ward} announced a snapshot header of {int(theirs)} bytes")
        raw = torch.empty(int(theirs), dtype=torch.uint8)
        batch([(torch.frombuffer(bytearray(header), dtype=torch.uint8), self.partner)], [(raw, self.ward)])
        try:
            got = PeerHeader.from_json(json.loads(raw.numpy().tobytes()), where=f"rank {self.ward}'s snapshot")
        except Exception as err:  # a snapshot that does not read is none: the recovery falls back to the checkpoint
            raise PeerStateError(f"rank {self.ward}'s snapshot header does not read: {err}") from None
        buffers = {k: torch.empty(size, dtype=torch.uint8) for k, (size, _) in got.tensors.items()}
        batch([(as_bytes(t), self.partner) for t in own.tensors.values()], [(b, self.ward) for b in buffers.values()])
        for key, buffer in buffers.items():
            if tensor_crc(buffer) != got.tensors[key][1]:
                raise PeerStateError(f"{key} of rank {self.ward}'s snapshot fails its CRC-32C")
        return KeptState(got.boundary, buffers)


def batch(sends: list[tuple[torch.Tensor, int]], receives: list[tuple[torch.Tensor, int]]) -> None:
    """Post every send and receive at once and wait for all (a ring of blocking sends would deadlock)."""
    ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends] + [dist.P2POp(dist.irecv, t, p) for t, p in receives]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
