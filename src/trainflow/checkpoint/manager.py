"""Sharded, atomic, CRC-verified checkpoints through torch.distributed.checkpoint (DCP).

Save: every rank writes its shard into `step-N.tmp/` (DCP: one `__{rank}_0.distcp` per rank plus
`.metadata`), then rank 0 checksums and fsyncs every file, writes manifest.json and renames the
folder to `step-N/`. A crash at any moment leaves `step-N.tmp/` (ignored, removed by the next
save) and every older checkpoint intact. Load: rank 0 verifies the manifest of the newest
candidate, falls back to older ones on a mismatch, and all ranks load the step it chose.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from trainflow.checkpoint.manifest import ChecksumError, write_manifest
from trainflow.checkpoint.manifest import verify as verify_manifest

log = logging.getLogger("trainflow.checkpoint")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def list_steps(root: Path) -> list[int]:
    """Completed checkpoints (renamed into place), oldest first."""
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))


class CheckpointManager:
    def __init__(self, root: str | Path, *, keep: int, pinned: set[int]) -> None:
        self.root = Path(root)
        self.keep, self.pinned = keep, pinned
        self.rank = dist.get_rank()

    def save(self, step: int, state: dict, *, before_commit: Callable[[], None] = lambda: None, **meta: object) -> float:
        """Write checkpoint `step` atomically; returns the seconds it took (for Young/Daly).

        `before_commit` runs on every rank after the shards are written, before the manifest and
        rename: the fault-injection point of a crash mid-checkpoint."""
        start = time.perf_counter()
        final, tmp = step_dir(self.root, step), self.root / f"step-{step:08d}.tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp, thread_count=2))
        before_commit()
        dist.barrier()
        if self.rank == 0:
            manifest = write_manifest(tmp, step=step, **meta)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            self.prune()
            nbytes = sum(f["bytes"] for f in manifest["files"].values())
            log.info("Saved checkpoint step %d (%d files, %.1f MB) in %.2f s", step, len(manifest["files"]),
                     nbytes / 1e6, time.perf_counter() - start)
        dist.barrier()
        return time.perf_counter() - start

    def prune(self) -> None:
        """Keep the newest `keep` checkpoints and every pinned one (segment ends)."""
        unpinned = [s for s in list_steps(self.root) if s not in self.pinned]
        for s in unpinned[: max(len(unpinned) - self.keep, 0)]:
            shutil.rmtree(step_dir(self.root, s))

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
        start = time.perf_counter()
        dcp.load(state, checkpoint_id=step_dir(self.root, step))
        log.info("Loaded checkpoint step %d in %.2f s", step, time.perf_counter() - start)
