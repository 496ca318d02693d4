"""A rank's training state carried across a recovery from peers (resilience.recovery=peers, launch.peers) without the
file system: a surviving rank keeps its own in memory as its communicators break, and a replacement rank receives it
from a live data-parallel replica over the new ones, each tensor checked against the sender's CRC-32C.

    kept = KeptState.of(trainer)                 # a survivor, as its collective fails: the state at its step's start
    step = restored(new_trainer, rank, kept, plan)   # in the next generation: sent, received, adopted

The state is a checkpoint's: the model's and optimizer's local tensors (fp8's amax histories among the model's
buffers), and what a manifest carries beside them (the step, the stream's position, the schedule, the guard's losses).
A step that failed part way leaves the tensors as its start had them (a collective failed before the optimizer stepped:
trainflow's steps have none after it), but it had drawn its rows and judged its loss: the stream's position and the
guard's state are taken at each step's start (Trainer.boundary), so the retried step draws the same rows and the run
continues bit for bit. Written by hand: torchft heals a replica from a live peer but owns the process groups and the
quorum of every step, and NVRx's in-process restart re-runs the training function with state the caller must reload;
neither sends a DTensor layout's shards between two given ranks of trainflow's own mesh (docs/fault-tolerance.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import crc32c
import torch
import torch.distributed as dist

from trainflow.checkpoint.manifest import GuardState
from trainflow.checkpoint.state import load_state
from trainflow.config.schedule import Schedule
from trainflow.data.stream import DataStream
from trainflow.errors import TrainflowError
from trainflow.records import Record, RecordError
from trainflow.stream_position import StreamPosition
from trainflow.tensors import local

HEADER_BYTES = 64 << 20
"""The most bytes a state's header may take (its CRCs and positions: kilobytes); a sender claiming more is refused."""


class PeerStateError(TrainflowError):
    """A replica's state that is not this rank's: another layout, a tensor that fails its CRC, a header that does not
    read. The recovery from peers falls back to the checkpoint (launch.peers)."""


@dataclass(frozen=True)
class Boundary(Record):
    """What a step's start holds beside the tensors: the rows it draws and the losses it is judged against."""

    step: int
    stream: StreamPosition
    schedule: Schedule
    guard: GuardState
    init_from: str | None = None


@dataclass(frozen=True)
class PeerHeader(Record):
    """What a replica sends ahead of the tensors: the boundary, and each tensor's bytes and CRC-32C by key."""

    boundary: Boundary
    tensors: dict[str, list[int]]
    """key -> [bytes, CRC-32C] of its local tensor, in the order they follow."""


@dataclass
class KeptState:
    """One rank's state: the boundary and its local tensors by key ("model/<fqn>", "optim/<key>")."""

    boundary: Boundary
    tensors: dict[str, torch.Tensor]

    @classmethod
    def of(cls, trainer: object) -> KeptState | None:
        """The trainer's state at its current step's start (its tensors, not copied: they outlive the trainer); None
        before its first step (no boundary yet, or an optimizer without state, which reading would make: a zero
        step, checkpoint.state.state_bytes)."""
        if not hasattr(trainer, "boundary") or not all(opt.state for opt in trainer.optimizers):
            return None
        return cls(trainer.boundary, state_tensors(trainer.ckpt.state()))


def state_tensors(state: dict) -> dict[str, torch.Tensor]:
    """The local tensors of a checkpoint state (checkpoint.state.build_state), flat and sorted by key."""
    flat = {f"{s}/{k}": v for s in ("model", "optim") for k, v in state[s].items() if isinstance(v, torch.Tensor)}
    return {k: local(flat[k]).detach() for k in sorted(flat)}


def adopt(trainer: object, state: dict, kept: KeptState) -> int:
    """Copy `kept` into a trainer built for the same layout (its model, optimizer, stream, schedule and guard) through
    its checkpoint state `state`; the step it continues from. One PeerStateError where the tensors are not this
    layout's."""
    into = state_tensors(state)
    if (missing := into.keys() ^ kept.tensors.keys()) or any(into[k].shape != kept.tensors[k].shape for k in into):
        wrong = sorted(missing) or [k for k in into if into[k].shape != kept.tensors[k].shape]
        raise PeerStateError(f"the state held in memory is not this layout's (first differing key: {wrong[0]})")
    with torch.no_grad():
        for key, tensor in into.items():
            tensor.copy_(kept.tensors[key])
    b = kept.boundary
    state["step"] = torch.tensor(b.step)
    state["rng"] = torch.get_rng_state()
    load_state(trainer.model.named_parts(), trainer.optimizers, state)
    ckpt = trainer.ckpt
    ckpt.guard.restore(b.guard)
    ckpt.stream = DataStream(b.stream, weights=ckpt.weights, seed=trainer.cfg.train.seed)
    ckpt.schedule, ckpt.init_from = b.schedule, b.init_from
    return b.step


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes, flat (a view where it is contiguous): what goes over the wire, whatever its dtype and shape (a
    snapshot is held as bytes by a rank of another layout's stage: train.snapshots)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def tensor_crc(t: torch.Tensor) -> int:
    return crc32c.crc32c(as_bytes(t.detach().cpu()).numpy())


def encoded_header(kept: KeptState) -> torch.Tensor:
    """`kept`'s header (PeerHeader: its boundary, each tensor's bytes and CRC-32C), as the bytes that go ahead of its
    tensors."""
    tensors = {k: [t.nbytes, tensor_crc(t)] for k, t in kept.tensors.items()}
    text = json.dumps(PeerHeader(kept.boundary, tensors).to_json())
    return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)


def decoded_header(raw: bytes, *, where: str) -> PeerHeader:
    """The header in `raw`; one PeerStateError naming `where` if it does not read as one (a peer's bytes are input like
    a file's: parsed as JSON records, never unpickled)."""
    try:
        return PeerHeader.from_json(json.loads(raw), where=where)
    except (ValueError, RecursionError, RecordError) as err:
        raise PeerStateError(f"{where} does not read: {err}") from None


def send_state(kept: KeptState, *, to: int) -> None:
    """Send `kept` to global rank `to` (its header's size, its header, then each tensor)."""
    header = encoded_header(kept)
    dist.send(torch.tensor([header.numel()], dtype=torch.int64), dst=to)
    dist.send(header, dst=to)
    for tensor in kept.tensors.values():
        dist.send(as_bytes(tensor), dst=to)


def receive_state(mine: dict[str, torch.Tensor], *, source: int) -> KeptState:
    """The state global rank `source` sends (send_state), into tensors shaped as `mine` (this rank's state_tensors);
    one PeerStateError where its header does not read, names other tensors, or a tensor fails its CRC."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, src=source)
    if not 0 < int(size) <= HEADER_BYTES:
        raise PeerStateError(f"rank {source} announced a state header of {int(size)} bytes (at most {HEADER_BYTES})")
    raw = torch.empty(int(size), dtype=torch.uint8)
    dist.recv(raw, src=source)
    header = read_header(raw.numpy().tobytes(), mine, source=source)
    received = {}
    for key, tensor in mine.items():
        buffer = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        dist.recv(as_bytes(buffer), src=source)
        received[key] = checked(key, buffer, header, source=source)
    return KeptState(header.boundary, received)


def read_header(raw: bytes, mine: dict[str, torch.Tensor], *, source: int) -> PeerHeader:
    """The header rank `source` sent, for this rank's tensors `mine`; one PeerStateError where it does not read
    (decoded_header) or names other tensors."""
    header = decoded_header(raw, where=f"rank {source}'s state header")
    if list(header.tensors) != list(mine) or any(header.tensors[k][0] != t.nbytes for k, t in mine.items()):
        raise PeerStateError(f"rank {source} holds another layout's state than this rank's (its tensors differ)")
    return header


def checked(key: str, received: torch.Tensor, header: PeerHeader, *, source: int, what: str = "") -> torch.Tensor:
    """`received` where its CRC-32C is the one its header gives; one PeerStateError naming it otherwise (`what`: the
    state it belongs to, where not rank `source`'s own: its snapshot)."""
    if (crc := tensor_crc(received)) != (sent := header.tensors[key][1]):
        of = what or f"rank {source}"
        raise PeerStateError(f"{key} from {of} fails its CRC-32C ({crc:#010x}, sent {sent:#010x})")
    return received


def restored(trainer: object, rank: int, kept: KeptState | None, plan: object, snapshots: object = None) -> int | None:
    """Where this rank's state comes from in a generation after the first (its launch.peers.RecoveryPlan): a
    replacement's from its replica (received), a survivor's from memory, after it sent its own to the replacements
    it serves; under a plan from snapshots (train.snapshots), every survivor's from its own snapshot and a
    replacement's from its partner's copy. The step they continue from; None: a checkpoint's (the first generation,
    or one whose survivors did not agree on their step)."""
    if plan is None or plan.step < 0:
        return None
    state = trainer.ckpt.state()  # on every rank before any sends: making the optimizer's state may be collective
    if plan.snapshot:
        kept = snapshots.own(plan.step) if snapshots is not None else None
    if str(rank) in plan.sources:
        kept = receive_state(state_tensors(state), source=plan.sources[str(rank)])
    for replaced, source in sorted(plan.sources.items(), key=lambda item: int(item[0])):
        if source == rank:
            sent = snapshots.held(plan.step) if plan.snapshot and snapshots is not None else kept
            if sent is None:
                raise PeerStateError(f"rank {rank} holds no state to send replacement rank {replaced}")
            send_state(sent, to=int(replaced))
    if kept is None:
        raise PeerStateError(f"rank {rank} holds no state of step {plan.step}")
    if kept.boundary.step != plan.step:
        raise PeerStateError(f"rank {rank} holds step {kept.boundary.step}'s state, and the plan step {plan.step}'s")
    return adopt(trainer, state, kept)
