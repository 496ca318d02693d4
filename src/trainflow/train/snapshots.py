"""Peer snapshots (checkpoint.snapshot_steps, under resilience.recovery=peers): every few steps each rank copies its
state into its own host memory and sends a copy to its partner, the rank of the same local index on the next node (in
another failure domain); it holds its ward's (the previous node's) in turn. Where a failure takes every live replica
of a shard (a layout without data-parallel replicas, or both replicas' nodes), the recovery from peers restores the
lost ranks from their partners' copies and every survivor from its own, all at the snapshot's step: at most
snapshot_steps steps lost, no checkpoint file read (launch.peer_recovery plans it).

    snapshots = PeerSnapshots(every=2, rank=rank, world=world, per_node=2)
    if snapshots.due(step): snapshots.take(trainer)      # Trainer.train, at a step's start

A snapshot is taken at the step's start, after its boundary (train.peer_state.Boundary) is marked: the tensors copied
to host memory (the step waits for that), then exchanged with the partner and the ward in the background, on a gloo
group of the generation's own beside training's, in one batch of point-to-point sends and receives per phase, each
tensor checked against its sender's CRC-32C; the next snapshot waits for it to end. The newest two completed are kept:
a failure during an exchange finds the one before it complete on every rank (then up to twice snapshot_steps are
lost). Host memory per rank: four copies of its state (two snapshots, each its own and its ward's), six while an
exchange runs (the new own copy and the ward's arriving), which plan.snapshots counts.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainflow.checkpoint.staging import check_host_memory
from trainflow.train.peer_state import (
    HEADER_BYTES,
    KeptState,
    PeerStateError,
    as_bytes,
    checked,
    decoded_header,
    encoded_header,
    state_tensors,
)

log = logging.getLogger(__name__)

SNAPSHOT_COPIES = 6
"""Copies of a rank's state in its host memory at the peak: two snapshots kept, each its own and its ward's, and while
the next is exchanged its own copy and the ward's arriving (plan.snapshots counts the same)."""


@dataclass
class PeerSnapshots:
    every: int
    rank: int
    world: int
    per_node: int
    kept: dict[int, tuple[KeptState, KeptState]] = field(default_factory=dict)
    """Step -> (its own snapshot, its ward's as bytes) for the newest two exchanges completed: a failure during an
    exchange finds the one before it complete on every rank."""
    group: object = None
    """The generation's group for the exchanges (attach): a gloo group of its own, beside training's."""
    thread: threading.Thread | None = None
    error: BaseException | None = None

    @property
    def partner(self) -> int:
        return (self.rank + self.per_node) % self.world

    @property
    def ward(self) -> int:
        return (self.rank - self.per_node) % self.world

    def steps(self) -> list[int]:
        """The steps of the snapshots it holds complete (its own and its ward's), oldest first."""
        return sorted(self.kept)

    def own(self, step: int) -> KeptState | None:
        return self.kept[step][0] if step in self.kept else None

    def held(self, step: int) -> KeptState | None:
        return self.kept[step][1] if step in self.kept else None

    def check_memory(self, state_nbytes: int) -> None:
        """At the step's start, on every rank (collective): refuse snapshots in one line where a host cannot hold
        SNAPSHOT_COPIES of each of its ranks' state (`state_nbytes`: checkpoint.state.state_bytes) more."""
        needs = (
            f"checkpoint.snapshot_steps={self.every} keeps up to {SNAPSHOT_COPIES} copies of every rank's state in "
            "host memory (two snapshots, each its own and its ward's, and the next one's while it is exchanged)"
        )
        fix = "set checkpoint.snapshot_steps=0, or give the job more host memory or fewer ranks per node"
        check_host_memory(SNAPSHOT_COPIES * state_nbytes, needs=needs, fix=fix)

    def attach(self, group: object) -> None:
        """Exchange on `group` from now on (a new generation's); an exchange of the broken one is left behind."""
        self.group, self.thread, self.error = group, None, None

    def due(self, step: int) -> bool:
        """Every `every` steps, from the first after step 0: a fresh optimizer has no state to copy yet, and reading
        it would make some (a zero step: checkpoint.state.state_bytes), changing the run."""
        return bool(self.every) and step > 0 and step % self.every == 0

    def take(self, trainer: object) -> None:
        """Snapshot the trainer's state at its current step's start into host memory (the step waits for that), then
        exchange copies with partner and ward in the background; the exchange before it must have ended first."""
        self.wait()
        tensors = {k: t.detach().to("cpu", copy=True) for k, t in state_tensors(trainer.ckpt.state()).items()}
        own = KeptState(trainer.boundary, tensors)
        self.thread = threading.Thread(target=self.exchanged, args=(own, self.group), name="trainflow-snapshot")
        self.thread.daemon = True  # one of a broken generation may wait on a dead peer: never joined then
        self.thread.start()

    def wait(self) -> None:
        """Wait for the exchange in flight; its error, where it failed (a peer lost: the generation breaks)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if (error := self.error) is not None:
            self.error = None
            raise error

    def exchanged(self, own: KeptState, group: object) -> None:
        try:
            held = self.exchange(own, group)
        except Exception as err:  # the training thread raises it at its next snapshot
            self.error = err
            return
        if group is self.group:  # not a broken generation's, finishing late
            self.kept[own.boundary.step] = (own, held)
            for old in sorted(self.kept)[:-2]:
                del self.kept[old]

    def exchange(self, own: KeptState, group: object) -> KeptState:
        """Send `own` to the partner and receive the ward's, in one batch per phase (sizes, headers, tensors)."""
        header = encoded_header(own)
        size, theirs = torch.tensor([header.numel()], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        batch([(size, self.partner)], [(theirs, self.ward)], group)
        if not 0 < int(theirs) <= HEADER_BYTES:
            raise PeerStateError(f"rank {self.ward} announced a snapshot header of {int(theirs)} bytes")
        raw = torch.empty(int(theirs), dtype=torch.uint8)
        batch([(header, self.partner)], [(raw, self.ward)], group)
        got = decoded_header(raw.numpy().tobytes(), where=f"rank {self.ward}'s snapshot header")
        buffers = {k: torch.empty(size, dtype=torch.uint8) for k, (size, _) in got.tensors.items()}
        sends = [(as_bytes(t), self.partner) for t in own.tensors.values()]
        batch(sends, [(b, self.ward) for b in buffers.values()], group)
        what = f"rank {self.ward}'s snapshot"
        return KeptState(got.boundary, {k: checked(k, b, got, source=self.ward, what=what) for k, b in buffers.items()})


def batch(sends: list[tuple[torch.Tensor, int]], receives: list[tuple[torch.Tensor, int]], group: object) -> None:
    """Post every send and receive at once on `group` and wait for all (a ring of blocking sends would deadlock)."""
    ops = [dist.P2POp(dist.isend, t, peer, group) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer, group) for t, peer in receives]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
