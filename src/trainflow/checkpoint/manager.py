"""Sharded, atomic, CRC-verified checkpoints through torch.distributed.checkpoint (DCP).

Save: every rank writes its shard into `step-N.tmp/` (DCP: `__{rank}_{i}.distcp` per rank plus
`.metadata`), checksumming the bytes as it writes them (checkpoint.writer); rank 0 gathers the
checksums, writes manifest.json, fsyncs, renames the folder to `step-N/` and fsyncs its parent. A crash
at any moment leaves `step-N.tmp/` (ignored, removed by the next save) and every older checkpoint intact.
Old checkpoints are pruned in a background thread (as torchtitan purges), so training waits only for
the new one to be durable. A save that fails on any rank (a full disk, an I/O error) raises the same
one-line CheckpointWriteError on every rank and removes `step-N.tmp/`; nothing is renamed into place.
checkpoint.mode=async stages the state to host memory and writes it in a background process, with the
same commit at a later step boundary (checkpoint.background; `poll` at every boundary, `finish` at the end).
Load: rank 0 verifies the manifest of the newest candidate, falls back to older ones on a mismatch,
and all ranks load the step it chose, trusting nothing in the folder (checkpoint.reader).
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor
from torch.utils.serialization import config as serialization_config

from trainflow.atomic import fsync_path
from trainflow.checkpoint.async_saves import AsyncSaves
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.interval import SaveDone
from trainflow.checkpoint.manifest import NO_PROVENANCE, ChecksumError, Provenance, write_manifest
from trainflow.checkpoint.manifest import verify as verify_manifest
from trainflow.checkpoint.reader import ExactLoadPlanner, InPlaceReader
from trainflow.checkpoint.staging import check_host_memory
from trainflow.checkpoint.writer import CheckpointWriteError, ChecksummingWriter, describe_failure

__all__ = ["CheckpointManager", "CheckpointWriteError", "list_steps", "step_dir", "tensor_bytes"]

log = logging.getLogger(__name__)
CPU = torch.device("cpu")


def tensor_bytes(state: dict) -> int:
    """Bytes of this rank's tensors in `state` (a DTensor counts its local shard)."""
    return sum(
        tensor_bytes(v) if isinstance(v, dict) else (v.to_local() if isinstance(v, DTensor) else v).nbytes
        for v in state.values()
    )


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
        self.keep, self.pinned, self.io_threads, self.mode = keep, pinned, io_threads, mode
        self.rank = dist.get_rank()
        self.collectives = device if dist.get_backend() == "nccl" else torch.device("cpu")
        """Where the small tensors of this module's own collectives live (NCCL takes device tensors only)."""
        self.background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainflow-commit")
        """Rank 0's thread for prunes and async commits, in order."""
        self.pruning: Future | None = None
        if mode == "async" and staging_bytes is not None:
            check_host_memory(staging_bytes)
        self.saves = AsyncSaves(self, device) if mode == "async" else None

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
        if self.saves is not None:
            return self.saves.start(
                step, state, optimizers=optimizers, step_s=step_s, before_commit=before_commit, provenance=provenance
            )
        start, started = time.perf_counter(), time.time()
        tmp = step_dir(self.root, step, "tmp")
        if self.rank == 0:
            self.wait()
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        # torch.save's zip CRC-32 runs in software over every byte; the manifest's CRC-32C covers
        # the same bytes with the CPU's CRC instruction, so the zip one is left out (torch.load
        # does not check it).
        writer = ChecksummingWriter(tmp, thread_count=self.io_threads)
        failure = None
        try:
            with serialization_config.patch("save.compute_crc32", False):
                dcp.save(state, storage_writer=writer)
        except CheckpointException as err:  # raised on every rank; each reports only its own failure
            if self.rank in err.failures:
                failure = describe_failure(None, err.failures[self.rank][0])
        if writer.failure is not None:  # the precise one, also where DCP dropped it
            failure = describe_failure(*writer.failure)
        before_commit()
        reports = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object((writer.checksums, tensor_bytes(state), failure), reports, dst=0)  # also: all ranks are done
        outcome = [self.commit(step, tmp, reports, provenance) if self.rank == 0 else None]
        outcome.append(SaveDone(step, started, time.perf_counter() - start, step_s))  # rank 0's, below
        dist.broadcast_object_list(outcome, src=0)
        if outcome[0] is not None:
            raise CheckpointWriteError(outcome[0])
        return [outcome[1]]

    def poll(self) -> list[SaveDone]:
        """At every step boundary: in async mode, where the save in flight stands (a collective while one is), the
        save if it just became durable; raises CheckpointWriteError on every rank if it failed anywhere."""
        return [] if self.saves is None else self.saves.poll()

    def finish(self) -> list[SaveDone]:
        """Where training stops (a stop signal, the segment's end): wait for the save in flight, if any."""
        return [] if self.saves is None else self.saves.finish()

    def commit(self, step: int, tmp: Path, reports: list, provenance: Provenance) -> str | None:
        """Rank 0, given every rank's (checksums, tensor bytes, failure): write the manifest (fsyncing every file),
        rename `tmp` into place and fsync the folder it is in, or else remove it and return the one-line error."""
        start = time.perf_counter()
        failed = [(rank, failure) for rank, (_, _, failure) in enumerate(reports) if failure is not None]
        if not failed:
            try:
                checksums = {k: v for c, _, _ in reports for k, v in c.items()}
                manifest = write_manifest(tmp, checksums, world_size=len(reports), step=step, provenance=provenance)
                shutil.rmtree(step_dir(self.root, step), ignore_errors=True)
                tmp.rename(step_dir(self.root, step))
                fsync_path(self.root)  # the rename is durable once its folder is
            except (ChecksumError, OSError) as err:
                failed = [(0, describe_failure(None, err))]
        if failed:
            shutil.rmtree(tmp, ignore_errors=True)  # else the partial write holds its space until the next save
            return self.write_error(step, *failed[0], needs=sum(nbytes for _, nbytes, _ in reports))
        self.pruning = self.background.submit(self.prune)
        log.info(
            "Saved checkpoint step %d (%d files, %.1f MB), committed in %.2f s",
            step,
            len(manifest.files),
            manifest.nbytes / 1e6,
            time.perf_counter() - start,
        )
        return None

    def write_error(self, step: int, rank: int, failure: tuple, *, needs: int) -> str:
        """The one line a failed save raises on every rank: the cause, the rank, the file, the fix."""
        code, text, path = failure
        if code == errno.ENOSPC:
            return (
                f"no space left on {self.root} writing step {step} ({path}, rank {rank}; needs ~{needs / 1e9:.3g} GB, "
                "estimated from the tensor bytes of every rank's state); free space there or move the checkpoints to "
                "a larger file system"
            )
        if code is not None:
            return (
                f"{text} on {self.root} writing step {step} ({path}, rank {rank}); the previous checkpoints are "
                "intact, fix the file system and save again"
            )
        return (
            f"writing step {step} to {self.root} failed on rank {rank} ({path}): {text}; the previous checkpoints are "
            "intact: rerun to resume from the newest (if it recurs, the node's kernel log says what killed a process)"
        )

    def prune(self) -> None:
        """Keep the newest `keep` checkpoints and every pinned one (segment ends); remove what
        crashed saves and prunes left. A checkpoint is renamed out of the way before it is
        deleted, so a crash mid-prune never leaves a half-deleted `step-N/`."""
        unpinned = [s for s in list_steps(self.root) if s not in self.pinned]
        for s in unpinned[: max(len(unpinned) - self.keep, 0)]:
            step_dir(self.root, s).rename(step_dir(self.root, s, "pruned"))
        for leftover in [*self.root.glob("step-*.pruned"), *self.root.glob("step-*.tmp")]:
            shutil.rmtree(leftover)

    def wait(self) -> None:
        """Finish the pending prune, raising what it raised."""
        if self.pruning is not None:
            self.pruning, pending = None, self.pruning
            pending.result()

    def close(self) -> None:
        if self.saves is not None:
            self.saves.close()
        self.wait()
        self.background.shutdown()

    def newest_valid(self, at_most: int) -> int:
        """The newest checkpoint <= at_most whose files match their manifest (-1: none); agreed by all ranks."""
        chosen = torch.tensor(-1)
        if self.rank == 0:
            for step in reversed([s for s in list_steps(self.root) if s <= at_most]):
                try:
                    verify_manifest(step_dir(self.root, step))
                    chosen.fill_(step)
                    break
                except ChecksumError as err:
                    log.warning("Skipped checkpoint step %d: %s", step, err)
        dist.broadcast(chosen, src=0)
        return int(chosen)

    def load(self, step: int, state: dict) -> None:
        if self.saves is not None:
            self.saves.wait_staged()  # a save's background copy reads the tensors this load writes
        start = time.perf_counter()
        reader = InPlaceReader(step_dir(self.root, step), thread_count=self.io_threads)
        try:
            dcp.load(state, storage_reader=reader, planner=ExactLoadPlanner())
        except CheckpointException as err:  # its text holds every failing rank's traceback
            rank, (cause, _) = next(iter(err.failures.items()))
            cause = reader.metadata_error or cause  # 2.11 says only "metadata is None"; 2.12+ append the error
            cause = " ".join(str(cause).split())  # one line, whatever the cause's own text looks like
            raise ChecksumError(
                f"loading {step_dir(self.root, step)} failed on rank {rank}: {cause}; the seed's remedy: check its "
                f"CRCs (python -m trainflow.stages.verify_checkpoint io.checkpoints={self.root}) and, on Lustre, "
                "the folder's stripe count "
                "(lfs getstripe -c, seed: >= 4)"
            ) from err
        log.info("Loaded checkpoint step %d in %.2f s", step, time.perf_counter() - start)
