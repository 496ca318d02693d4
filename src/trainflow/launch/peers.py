"""Recovery from peers (resilience.recovery=peers), the ranks' side: each rank's line to its supervisor's store
(launch.peer_recovery), across the generations of its communicators.

    python -m trainflow.stages.train_segment parallel=dp2 cluster.allocation.spare_nodes=1 resilience.recovery=peers \
        fault.step=3 fault.rank=1 fault.signal=KILL

Generation 0 is the job step's start. When a rank's collective fails (a peer died), the rank reports where it stands
(its step, its process) under the generation's key in the supervisor's store and waits for the plan of the next one:
which ranks start anew on a spare node and the step every survivor stands at. A survivor then builds the next
generation's process group from a fresh rendezvous in the same store (a key prefix per generation: no rank of an
older one can join it), rebuilds its model on it and keeps its state from memory; a replacement rank receives its own
from a live data-parallel replica (train.peer_state), each tensor CRC-checked. No checkpoint file is read. A rank
the plan replaces (its node left out) exits; where survivors disagree on their step (a collective completed on some,
not on others) every rank loads the newest checkpoint instead, in process; a plan that gives up (no spare, no live
replica, no peer missing: the failure was the rank's own) ends every rank with its error, which the supervisor hands
to the job-level restart.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from trainflow.checkpoint.reads import checkpoint_bytes_read
from trainflow.config import ParallelDims, RuntimeConfig
from trainflow.errors import TrainflowError
from trainflow.host import hostname
from trainflow.records import Record, RecordError

log = logging.getLogger(__name__)

STORE = "TRAINFLOW_PEERS"
"""host:port of the supervisor's store, set where resilience.recovery=peers (launch.peer_recovery)."""
JOINS = "TRAINFLOW_JOINS"
"""The generation a replacement rank joins (absent: 0, the step's start)."""
REPLACED_EXIT = 75
"""How a rank whose node the plan replaced exits (its state lives on in the replacement)."""
PREFIX = "trainflow/peers"
PLAN_MARGIN_S = 120.0
"""How much longer than the supervisor's longest wait for a broken generation's reports (a collective timeout, then
resilience.failure_detect_s) a rank waits for its plan: the spares' probe (launch.steps.PROBE_S) and the verdict."""


def generation_key(generation: int, name: str) -> str:
    return f"{PREFIX}/{generation}/{name}"


class PeerLost(RuntimeError):
    """The error that broke a rank's generation, in words (the original's traceback would keep its trainer alive)."""


class RecoveryRefused(TrainflowError):
    """The supervisor gave up recovering from peers: the rank ends with the error that broke its generation."""


@dataclass(frozen=True)
class Broken(Record):
    """What a rank reports as its generation breaks."""

    rank: int
    step: int
    """The step it would train next: its state is that step's start (train.peer_state)."""
    pid: int
    host: str
    at: float
    """When it caught the error (time.time())."""
    error: str
    checkpoint_bytes: int = 0
    """Bytes its process had read from checkpoint files by then."""
    snapshots: list[int] = field(default_factory=list)
    """The steps of the peer snapshots it holds complete, each its own and its ward's (train.snapshots)."""


@dataclass(frozen=True)
class RecoveryPlan(Record):
    """The supervisor's word on a broken generation (under its `plan` key)."""

    generation: int
    """The generation to join."""
    replaced: list[int]
    """The ranks started anew on a spare; a live one among them exits."""
    step: int
    """The step every survivor stands at; -1: they disagree, and every rank loads the newest checkpoint."""
    sources: dict[str, int]
    """Replaced rank (as text) -> the live data-parallel replica that sends it its state."""
    refused: str = ""
    """Why no recovery from peers follows ('' where one does): the ranks end with their errors."""
    snapshot: bool = False
    """The state comes from peer snapshots (train.snapshots): every survivor goes back to its own of `step`, and each
    source sends the copy it holds of its replaced rank's."""


def replica_source(rank: int, dims: ParallelDims, lost: set[int]) -> int | None:
    """The rank holding `rank`'s shard of the state in another data-parallel replica, not in `lost` (the lowest
    replica that is live); None: every replica of it is lost. Mesh order pp, dp, [cp], tp (parallel.mesh): dp is
    replica x shard under HSDP, and replicas differ in the replica index alone."""
    tp, cp, dp = dims.tp, dims.cp, dims.dp
    shard = dims.shard_size  # dp under FSDP over all of it: one replica
    t, c, d, p = rank % tp, rank // tp % cp, rank // (tp * cp) % dp, rank // (tp * cp * dp)
    s = d % shard
    for replica in range(dp // shard):
        candidate = ((p * dp + replica * shard + s) * cp + c) * tp + t
        if candidate != rank and candidate not in lost:
            return candidate
    return None


@dataclass
class PeerLink:
    """A rank's line to the supervisor's store (its address in STORE), and the generation it is in."""

    rank: int
    world: int
    runtime: RuntimeConfig
    generation: int = 0

    def __post_init__(self) -> None:
        import torch.distributed as dist

        host, _, port = os.environ[STORE].rpartition(":")
        wait = datetime.timedelta(seconds=self.runtime.collective_timeout_s)
        self.store = dist.TCPStore(host, int(port), is_master=False, timeout=wait)
        self.generation = int(os.environ.get(JOINS, "0"))
        self.plan: RecoveryPlan | None = None
        """The plan of the generation this rank is in (None in the first): a replacement reads the one it joins."""
        if self.generation:
            self.plan = self.read_plan(self.generation - 1)

    def read_plan(self, generation: int) -> RecoveryPlan:
        """The supervisor's plan after generation `generation` broke, read as a record (ValueError, RecordError where
        it does not read as one)."""
        key = generation_key(generation, "plan")
        return RecoveryPlan.from_json(json.loads(self.store.get(key)), where=f"the store's {key}")

    def prefixed(self, name: str) -> object:
        import torch.distributed as dist

        return dist.PrefixStore(generation_key(self.generation, name), self.store)

    @contextlib.contextmanager
    def group(self, device: object) -> Iterator[None]:
        """The generation's default process group, from its own rendezvous in the supervisor's store."""
        import torch.distributed as dist

        r = self.runtime
        dist.init_process_group(
            backend=r.backend,
            store=self.prefixed("rendezvous"),
            rank=self.rank,
            world_size=self.world,
            timeout=datetime.timedelta(seconds=r.collective_timeout_s),
            device_id=device if r.backend == "nccl" else None,
        )
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # aborted already where it broke
                dist.destroy_process_group()

    @staticmethod
    def abort() -> None:
        """Abort this generation's process groups, so that a collective another rank waits in with this one ends now
        (NCCL's communicators abort; NVRx's in-process restart does the same). Gloo's do not: a rank waiting only on
        survivors leaves its collective at cluster.runtime.collective_timeout_s (measured: aborting, destroying and
        unregistering every group left a tp peer's pending all-reduce waiting), which the supervisor waits for while
        its heartbeat beats. Private in torch 2.13."""
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()

    def broken(self, step: int, error: BaseException, timeout_s: float, snapshots: list[int] = ()) -> RecoveryPlan:
        """Report that this generation broke at `step` (and the steps of the snapshots this rank holds complete), and
        wait for the supervisor's plan of the next one."""
        said = f"{type(error).__name__}: {error}"[:500]
        read = checkpoint_bytes_read()
        report = Broken(self.rank, step, os.getpid(), hostname(), time.time(), said, read, list(snapshots))
        self.store.set(generation_key(self.generation, f"broken/{self.rank}"), json.dumps(report.to_json()))
        self.store.add(generation_key(self.generation, "broken"), 1)
        key = generation_key(self.generation, "plan")
        self.store.set_timeout(datetime.timedelta(seconds=timeout_s))  # the supervisor's judgement may take a while
        try:
            self.store.wait([key])
            plan = self.read_plan(self.generation)
        except (RuntimeError, ValueError, RecordError) as err:  # no plan in time, or one that does not read
            raise RecoveryRefused(f"no recovery plan for generation {self.generation}: {err}") from error
        if plan.refused:
            raise RecoveryRefused(f"the supervisor did not recover from peers: {plan.refused}") from error
        self.generation, self.plan = plan.generation, plan
        return plan
