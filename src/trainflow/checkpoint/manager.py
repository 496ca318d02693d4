"""Sharded, atomic, CRC-verified checkpoints through torch.distributed.checkpoint (DCP).

Save: every rank writes its shard into `step-N.tmp/` (DCP: `__{rank}_{i}.distcp` per rank plus
`.metadata`), checksumming the bytes as it writes them (checkpoint.writer); rank 0 gathers the
checksums, writes manifest.json, fsyncs, renames the folder to `step-N/` and fsyncs its parent (checkpoint.commit).
A crash at any moment leaves `step-N.tmp/` (ignored, removed by the next save) and every older checkpoint intact.
Old checkpoints are pruned in a background thread (as torchtitan purges), so training waits only for
the new one to be durable. A save that fails on any rank (a full disk, an I/O error) raises the same
one-line CheckpointWriteError on every rank and removes `step-N.tmp/`; nothing is renamed into place.
checkpoint.mode (SaveMode) chooses, once, how a save runs (checkpoint.saves): sync writes it inline; async stages
the state to host memory and writes it in a background process, with the same commit at a later step boundary
(checkpoint.async_saves; `poll` at every boundary, `finish` at the end).
Load: rank 0 checks the newest candidate's manifest is complete (newest_complete), and all ranks load it, trusting
nothing in the folder (checkpoint.reader), reading each file once between them and checking its CRC-32C as they read
(checkpoint.single_read); a file that fails its check raises CorruptFileError on every rank, and the caller falls back
to the next older checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainflow.checkpoint.async_saves import AsyncSaves
from trainflow.checkpoint.checked_read import CorruptFileError
from trainflow.checkpoint.commit import Committer
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.interval import SaveDone
from trainflow.checkpoint.manifest import NO_PROVENANCE, ChecksumError, Provenance, check_complete, read_manifest
from trainflow.checkpoint.reader import ExactLoadPlanner
from trainflow.checkpoint.reads import count_read
from trainflow.checkpoint.saves import SaveMode, SyncSaves, tensor_bytes
from trainflow.checkpoint.single_read import SingleReader
from trainflow.checkpoint.writer import CheckpointWriteError
from trainflow.records import NewerFormatError, Record

__all__ = [
    "CheckpointManager",
    "CheckpointWriteError",
    "CorruptFileError",
    "SaveMode",
    "list_steps",
    "step_dir",
    "tensor_bytes",
]

log = logging.getLogger(__name__)
CPU = torch.device("cpu")


@dataclass(frozen=True)
class LoadDone(Record):
    """What a load read (CheckpointManager.load): the bytes this rank and all ranks read from the checkpoint's
    files, beside the checkpoint's own size (its manifest's files), the bytes of the files this rank had from
    other ranks' reads (mapped from a reader's memory on its host, received over the group) and those it sent of
    its own reads, once per receiver (checkpoint.single_read's LoadTally)."""

    step: int
    seconds: float
    bytes_read: int
    bytes_read_all: int
    checkpoint_bytes: int
    bytes_mapped: int
    bytes_received: int
    bytes_sent: int


class CheckpointManager:
    def __init__(
        self,
        root: str | Path,
        *,
        keep: int,
        pinned: set[int],
        io_threads: int = 2,
        mode: str = "sync",
        device: torch.device = CPU,
        staging_bytes: int | None = None,
    ) -> None:
        """`mode` is checkpoint.mode; in async mode `staging_bytes` (this rank's state, checkpoint.state's
        state_bytes) is checked against the host's free memory first, on every rank (a collective)."""
        self.root = Path(root)
        self.io_threads, self.rank = io_threads, dist.get_rank()
        self.committer = Committer(self.root, keep=keep, pinned=pinned)
        self.collectives = collectives = device if dist.get_backend() == "nccl" else CPU
        """Where the small tensors of the saves' and loads' own collectives live (NCCL takes device tensors only)."""
        self.host_memory = True
        """Whether a load's ranks of one host exchange through memory (checkpoint.host_shared), else over the group."""
        self.mode = SaveMode(mode)
        self.saves = (
            AsyncSaves(
                self.committer,
                io_threads=io_threads,
                device=device,
                collectives=collectives,
                staging_bytes=staging_bytes,
            )
            if self.mode is SaveMode.ASYNC
            else SyncSaves(self.committer, io_threads=io_threads)
        )

    def save(
        self,
        step: int,
        state: dict,
        *,
        optimizers: list[torch.optim.Optimizer] = (),
        step_s: float = float("nan"),
        before_commit: Callable[[], None] = lambda: None,
        provenance: Provenance = NO_PROVENANCE,
    ) -> list[SaveDone]:
        """Save checkpoint `step`; the saves that became durable during the call: this one in sync mode, the
        one in flight before it (waited for) in async mode, whose own turns durable at a later `poll` or
        `finish`.

        `optimizers` own most of `state` (async: their next step waits for its background copy); `step_s` is
        this rank's mean step time, which the record of the save carries as rank 0's. `before_commit` runs on
        every rank after the shards are written, before the manifest and rename: the fault-injection point
        of a crash mid-checkpoint. `provenance` goes into the manifest."""
        return self.saves.save(
            step, state, optimizers=list(optimizers), step_s=step_s, before_commit=before_commit, provenance=provenance
        )

    def poll(self) -> list[SaveDone]:
        """At every step boundary: in async mode, where the save in flight stands (a collective while one is), the
        save if it just became durable; raises CheckpointWriteError on every rank if it failed anywhere."""
        return self.saves.poll()

    def finish(self) -> list[SaveDone]:
        """Where training stops (a stop signal, the segment's end): wait for the save in flight, if any."""
        return self.saves.finish()

    def discard_after(self, step: int) -> tuple[list[SaveDone], list[int]]:
        """A rollback to `step`: wait for the save in flight (it may be of a step inside the bad run), then remove
        every checkpoint newer than `step` (rank 0); the saves that became durable and the steps removed."""
        done = self.saves.finish()
        return done, self.committer.discard_after(step)

    def wait(self) -> None:
        """Finish the pending prune, raising what it raised."""
        self.committer.wait()

    def close(self) -> None:
        self.saves.close()
        self.committer.close()

    def newest_complete(self, at_most: int) -> int:
        """The newest checkpoint <= at_most whose manifest is complete (-1: none), agreed by all ranks; its files'
        CRCs are checked by the ranks that read them, in `load`. A manifest newer than this trainflow reads stops the
        search on every rank (NewerFormatError): an older checkpoint would train its steps again."""
        chosen = torch.tensor([-1, 0], device=self.collectives)  # (step, 1 where its manifest's format is newer)
        if self.rank == 0:
            for step in reversed([s for s in list_steps(self.root) if s <= at_most]):
                try:
                    check_complete(step_dir(self.root, step), read_manifest(step_dir(self.root, step)))
                    chosen[0] = step
                    break
                except NewerFormatError:
                    chosen[:] = torch.tensor([step, 1])
                    break
                except ChecksumError as err:
                    log.warning("Skipped checkpoint step %d: %s", step, err)
        dist.broadcast(chosen, src=0)
        if chosen[1]:
            read_manifest(step_dir(self.root, int(chosen[0])))  # raises the same NewerFormatError on every rank
        return int(chosen[0])

    def load(self, step: int, state: dict) -> LoadDone:
        """Load checkpoint `step` into `state`, each file read by one rank (checkpoint.single_read); CorruptFileError
        on every rank where a file fails its CRC, ChecksumError where the folder is not what trainflow writes."""
        self.saves.wait_staged()  # an async save's background copy reads the tensors this load writes
        start, folder = time.perf_counter(), step_dir(self.root, step)
        manifest = read_manifest(folder)
        reader = SingleReader(
            folder,
            manifest=manifest,
            thread_count=self.io_threads,
            device=self.collectives,
            host_memory=self.host_memory,
        )
        try:
            dcp.load(state, storage_reader=reader, planner=ExactLoadPlanner())
        except CheckpointException as err:  # its text holds every failing rank's traceback
            rank, (cause, _) = next(iter(err.failures.items()))
            cause = reader.metadata_error or cause  # 2.11 says only "metadata is None"; 2.12+ append the error
            if isinstance(cause, CorruptFileError):  # the same on every rank: the caller falls back
                raise CorruptFileError(str(cause)) from err
            cause = " ".join(str(cause).split())  # one line, whatever the cause's own text looks like
            raise ChecksumError(
                f"loading {folder} failed on rank {rank}: {cause}; the seed's remedy: check its "
                f"CRCs (python -m trainflow.stages.verify_checkpoint io.checkpoints={self.root}) and, on Lustre, "
                "the folder's stripe count "
                "(lfs getstripe -c, seed: >= 4)"
            ) from err
        tally = reader.tally
        count_read(tally.bytes_read)
        count_read(tally.bytes_read)
        total = torch.tensor(tally.bytes_read, dtype=torch.int64, device=self.collectives)
        dist.all_reduce(total)
        done = LoadDone(
            step,
            time.perf_counter() - start,
            tally.bytes_read,
            int(total),
            manifest.nbytes,
            tally.bytes_mapped,
            tally.bytes_received,
            tally.bytes_sent,
        )
        log.info(
            "Loaded checkpoint step %d in %.2f s: this rank read %d bytes of its files, all %d ranks %d bytes (%.2f x "
            "the checkpoint's %d); it mapped %d bytes from its host's readers, received %d and sent %d",
            *(step, done.seconds, done.bytes_read, dist.get_world_size(), done.bytes_read_all),
            *(done.bytes_read_all / max(done.checkpoint_bytes, 1), done.checkpoint_bytes),
            *(done.bytes_mapped, done.bytes_received, done.bytes_sent),
        )
        return done
