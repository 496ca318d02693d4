"""The commit every save ends in, synchronous or asynchronous (checkpoint.saves, checkpoint.async_saves): rank 0,
given every rank's RankReport, writes the manifest (fsyncing every file), renames `step-N.tmp/` to `step-N/`,
fsyncs the folder it is in and prunes old checkpoints in a background thread; or, where any rank failed, removes
`step-N.tmp/` and returns the one line every rank raises.

    python -m pytest tests/unit/test_checkpoint_io.py tests/unit/test_checkpoint_async.py -k "full_disk"
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from trainflow.atomic import fsync_path
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import ChecksumError, Provenance, write_manifest
from trainflow.checkpoint.writer import RankReport, WriteFailure, describe_failure

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveRequest:
    """One save, on this rank, as both modes run it: staged, written into `folder`, committed."""

    step: int
    folder: Path
    """step-N.tmp/, made by Committer.prepare."""
    provenance: Provenance
    before_commit: Callable[[], None]
    """Runs on every rank once the shards are written, before the commit: the drill point of a crash mid-save."""
    step_s: float
    """This rank's mean step time, which the record of the save carries as rank 0's."""
    nbytes: int
    """The tensor bytes this rank's save plan writes, where known before the write (async: the cached plan's);
    else its whole state's."""
    started: float
    """time.time() when the save began."""
    t0: float
    """time.perf_counter() then."""


class Committer:
    """The checkpoint series' publisher: rank 0 writes, every rank holds one (prepare is called everywhere)."""

    def __init__(self, root: Path, *, keep: int, pinned: set[int]) -> None:
        self.root, self.keep, self.pinned = root, keep, pinned
        self.rank = dist.get_rank()
        self.background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainflow-commit")
        """Rank 0's thread for prunes and asynchronous commits, in order."""
        self.pruning: Future | None = None

    def prepare(
        self, step: int, *, provenance: Provenance, before_commit: Callable[[], None], step_s: float, nbytes: int
    ) -> SaveRequest:
        """The request of saving `step`; rank 0 makes its empty folder, which the other ranks may only write into
        after the caller's next collective."""
        started, t0 = time.time(), time.perf_counter()
        folder = step_dir(self.root, step, "tmp")
        if self.rank == 0:
            self.wait()  # a prune deletes leftover .tmp folders
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        return SaveRequest(step, folder, provenance, before_commit, step_s, nbytes, started, t0)

    def gather(self, report: RankReport) -> list[RankReport] | None:
        """Every rank's report, on rank 0 (None elsewhere); a collective, so also: every rank is done writing."""
        reports: list | None = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(report, reports, dst=0)
        return reports

    def commit(self, request: SaveRequest, reports: list[RankReport]) -> str | None:
        """Rank 0: publish the folder, or else remove it and return the one-line error of the first rank that failed
        (or of the commit itself)."""
        t0, step = time.perf_counter(), request.step
        failed = next(((rank, r.failure) for rank, r in enumerate(reports) if r.failure is not None), None)
        if failed is None:
            try:
                checksums = {k: v for r in reports for k, v in r.checksums.items()}
                manifest = write_manifest(
                    request.folder, checksums, world_size=len(reports), step=step, provenance=request.provenance
                )
                shutil.rmtree(step_dir(self.root, step), ignore_errors=True)
                request.folder.rename(step_dir(self.root, step))
                fsync_path(self.root)  # the rename is durable once its folder is
            except (ChecksumError, OSError) as err:
                failed = (0, describe_failure(None, err))
        if failed is not None:
            shutil.rmtree(
                request.folder, ignore_errors=True
            )  # else the partial write holds its space until the next save
            return self.write_error(step, *failed, needs=sum(r.nbytes for r in reports))
        self.pruning = self.background.submit(self.prune)
        log.info(
            "Saved checkpoint step %d (%d files, %.1f MB), committed in %.2f s",
            *(step, len(manifest.files), manifest.nbytes / 1e6, time.perf_counter() - t0),
        )
        return None

    def write_error(self, step: int, rank: int, failure: WriteFailure, *, needs: int) -> str:
        """The one line a failed save raises on every rank: the cause, the rank, the file, the fix."""
        if failure.errno == errno.ENOSPC:
            return (
                f"no space left on {self.root} writing step {step} ({failure.file}, rank {rank}; needs "
                f"~{needs / 1e9:.3g} GB, the tensor bytes of every rank's save plan); free space there or "
                "move the checkpoints to a larger file system"
            )
        if failure.errno is not None:
            return (
                f"{failure.text} on {self.root} writing step {step} ({failure.file}, rank {rank}); the previous "
                "checkpoints are intact, fix the file system and save again"
            )
        return (
            f"writing step {step} to {self.root} failed on rank {rank} ({failure.file}): {failure.text}; the previous "
            "checkpoints are intact: rerun to resume from the newest (if it recurs, the node's kernel log says what "
            "killed a process)"
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

    def discard_after(self, step: int) -> list[int]:
        """Rank 0: remove every checkpoint newer than `step` (a rollback's: saved inside the bad run, which a resume
        would otherwise pick as the newest), renamed out of the way first as a prune does; the steps removed."""
        if self.rank != 0:
            return []
        self.wait()
        newer = [s for s in list_steps(self.root) if s > step]
        for s in newer:
            step_dir(self.root, s).rename(step_dir(self.root, s, "pruned"))
            shutil.rmtree(step_dir(self.root, s, "pruned"))
        fsync_path(self.root)
        return newer

    def wait(self) -> None:
        """Finish the pending prune, raising what it raised."""
        if self.pruning is not None:
            self.pruning, pending = None, self.pruning
            pending.result()

    def close(self) -> None:
        self.wait()
        self.background.shutdown()
