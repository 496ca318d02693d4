"""How a save runs, chosen once (checkpoint.mode, SaveMode): one interface, Saves, with two implementations, as
Megatron-Core's AsyncRequest is one request run inline or in the background. A save is a SaveRequest (stage, write,
commit) and every mode ends in the same Committer (checkpoint.commit); SyncSaves runs the three inline, AsyncSaves
(checkpoint.async_saves) copies the state to host memory, hands the write to its writer process and commits at a
later step boundary.

    python -m pytest tests/unit/test_checkpoint_io.py -k checksums   # a synchronous save, re-read and loaded
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor
from torch.utils.serialization import config as serialization_config

from trainflow.checkpoint.commit import Committer
from trainflow.checkpoint.interval import SaveDone
from trainflow.checkpoint.manifest import Provenance
from trainflow.checkpoint.writer import CheckpointWriteError, ChecksummingWriter, RankReport, describe_failure


class SaveMode(enum.Enum):
    """checkpoint.mode."""

    SYNC = "sync"
    """Durable when save returns; training waits for the write."""
    ASYNC = "async"
    """Staged to host memory, written by a background process, durable at a later step boundary."""


def tensor_bytes(state: dict) -> int:
    """Bytes of this rank's tensors in `state` (a DTensor counts its local shard)."""
    return sum(
        tensor_bytes(v) if isinstance(v, dict) else (v.to_local() if isinstance(v, DTensor) else v).nbytes
        for v in state.values()
    )


class Saves(ABC):
    """One rank's side of a checkpoint series' saves; every rank calls each method at the same steps."""

    def __init__(self, committer: Committer, *, io_threads: int) -> None:
        self.committer, self.io_threads, self.rank = committer, io_threads, committer.rank

    @abstractmethod
    def save(
        self,
        step: int,
        state: dict,
        *,
        optimizers: list[torch.optim.Optimizer],
        step_s: float,
        before_commit: Callable[[], None],
        provenance: Provenance,
    ) -> list[SaveDone]:
        """Save `state` as checkpoint `step`; the saves that became durable during the call."""

    @abstractmethod
    def poll(self) -> list[SaveDone]:
        """At every step boundary: the saves that became durable since the last one."""

    @abstractmethod
    def finish(self) -> list[SaveDone]:
        """Where training stops: wait for the save in flight; the saves that became durable."""

    @abstractmethod
    def wait_staged(self) -> None:
        """Before anything writes into the live state (a load): nothing may still be reading it."""

    @abstractmethod
    def close(self) -> None:
        """Stop whatever the saves started (threads, processes)."""


class SyncSaves(Saves):
    """checkpoint.mode=sync: the request's three phases inline. dcp.save writes every rank's shards and rank 0's
    .metadata through ChecksummingWriter; then every rank's report goes to rank 0, which commits, and its outcome
    comes back to every rank."""

    def save(self, step, state, *, optimizers, step_s, before_commit, provenance) -> list[SaveDone]:
        request = self.committer.prepare(
            step, provenance=provenance, before_commit=before_commit, step_s=step_s, nbytes=tensor_bytes(state)
        )
        dist.barrier()  # every rank sees the folder rank 0 made
        # torch.save's zip CRC-32 runs in software over every byte; the manifest's CRC-32C covers the same bytes
        # with the CPU's CRC instruction, so the zip one is left out (torch.load does not check it).
        writer = ChecksummingWriter(request.folder, thread_count=self.io_threads)
        failure = None
        try:
            with serialization_config.patch("save.compute_crc32", False):
                dcp.save(state, storage_writer=writer)
        except CheckpointException as err:  # raised on every rank; each reports only its own failure
            if self.rank in err.failures:
                failure = describe_failure(None, err.failures[self.rank][0])
        failure = writer.failure or failure  # the precise one, also where DCP dropped it
        request.before_commit()
        nbytes = request.nbytes if writer.planned is None else writer.planned  # the plan's, once DCP made it
        reports = self.committer.gather(RankReport(dict(writer.checksums), nbytes, failure))
        error = self.committer.commit(request, reports) if reports is not None else None
        outcome = [error, SaveDone(step, request.started, time.perf_counter() - request.t0, step_s)]  # rank 0's
        dist.broadcast_object_list(outcome, src=0)
        if outcome[0] is not None:
            raise CheckpointWriteError(outcome[0])
        return [outcome[1]]

    def poll(self) -> list[SaveDone]:
        return []  # each save was durable when it returned

    def finish(self) -> list[SaveDone]:
        return []

    def wait_staged(self) -> None:
        pass  # nothing reads the state once save returns

    def close(self) -> None:
        pass  # no thread or process of its own: the committer's is the manager's to close
