"""The async save in flight and its way to durable, step boundary by step boundary (checkpoint.background says
why it is built so): stage, write in the background, agree, commit, agree.

    python -m pytest tests/unit/test_checkpoint_async.py -k durable

Every rank calls `start` at the same steps, then `poll` at every step boundary (one all_reduce of where its part
stands, while a save is in flight) and `finish` where training stops; every rank takes the same branch at every
boundary, so they run the same collectives. Phases: writing (the background copy and this rank's writer process),
then, once every rank's write succeeded, committing (rank 0's CheckpointManager.commit in its background thread),
then durable: the boundary that sees the commit done returns the SaveDone, rank 0's measurements on every rank.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.tensor import DTensor

from trainflow.checkpoint.background import WriterDied, WriterProcess, Written
from trainflow.checkpoint.folders import step_dir
from trainflow.checkpoint.interval import SaveDone
from trainflow.checkpoint.manifest import Provenance
from trainflow.checkpoint.staging import Staging
from trainflow.checkpoint.writer import CheckpointWriteError, ChecksummingWriter, describe_failure
from trainflow.tensors import local, storage_ptr

if TYPE_CHECKING:
    from trainflow.checkpoint.manager import CheckpointManager

log = logging.getLogger(__name__)


@dataclass
class Pending:
    """The save in flight, on this rank."""

    step: int
    folder: Path
    started: float
    step_s: float
    nbytes: int
    provenance: Provenance
    before_commit: Callable[[], None]
    blocking_s: float = 0.0
    phase: str = "writing"
    overlap_steps: int = 0
    written: Written | None = None
    failure: tuple | None = None
    """This rank's (errno, text, file) once its part failed."""
    commit: Future | None = None
    """Rank 0: the commit in its background thread; its result is the one-line error or None."""
    done: SaveDone | None = None


def layout_of(flat: dict) -> tuple:
    """What the cached save plan depends on: every entry's name, kind, shape and dtype, and this rank's part."""
    return tuple(
        (k, isinstance(v, DTensor), tuple(v.shape), v.dtype, tuple(local(v).shape), tuple(local(v).stride()))
        for k, v in flat.items()
    )


class AsyncSaves:
    """One rank's side of checkpoint.mode=async, for CheckpointManager."""

    def __init__(self, manager: CheckpointManager, device: torch.device) -> None:
        self.manager, self.rank = manager, manager.rank
        self.staging = Staging(device)
        self.writer: WriterProcess | None = None
        self.layout: tuple | None = None
        self.plan: SavePlan | None = None
        self.metadata: Metadata | None = None
        """Rank 0: the global metadata of the cached plan, which the commit completes and writes."""
        self.pending: Pending | None = None
        self.hooked: set[int] = set()

    def start(
        self, step: int, state: dict, *, optimizers, step_s: float, before_commit, provenance: Provenance
    ) -> list[SaveDone]:
        """Stage `state` and hand it to the writer process; the save in flight before it (waited for: one at a
        time) if there was one."""
        done = self.finish()
        t0, started = time.perf_counter(), time.time()
        flat, _ = flatten_state_dict(state)
        if bad := next((k for k, v in flat.items() if not isinstance(v, torch.Tensor)), None):
            raise TypeError(f"async saves stage tensors only: {bad!r} is a {type(flat[bad]).__name__}")
        folder = step_dir(self.manager.root, step, "tmp")
        if self.rank == 0:
            self.manager.wait()  # a prune deletes leftover .tmp folders
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        self.replan(state, flat, folder)  # collective: also, every rank sees the folder rank 0 made
        for opt in optimizers:
            if id(opt) not in self.hooked:  # the optimizer's next step waits for the background copy of its tensors
                opt.register_step_pre_hook(lambda *_: self.before_optimizer_step())
                self.hooked.add(id(opt))
        deferred = {storage_ptr(t) for opt in optimizers for t in optimizer_tensors(opt)}
        writer, threads = self.writer, self.manager.io_threads
        self.staging.start(flat, deferred=deferred, then=lambda: writer.write(folder, threads))
        nbytes = sum(local(v).nbytes for v in flat.values())
        self.pending = Pending(step, folder, started, step_s, nbytes, provenance, before_commit)
        self.pending.blocking_s = time.perf_counter() - t0
        return done

    def before_optimizer_step(self) -> None:
        """An optimizer's step changes what the background copy reads: it waits for it, and training is blocked
        for as long as it waits."""
        if self.staging.copying is None or self.staging.copying.done():
            return
        t0 = time.perf_counter()
        self.staging.settle()
        if self.pending is not None:
            self.pending.blocking_s += time.perf_counter() - t0

    def replan(self, state: dict, flat: dict, folder: Path) -> None:
        """DCP's save plan for this state, made once and kept while its layout holds (every rank agrees whether it
        does); a new plan (or a new writer process) is handed to the writer with the staging buffers."""
        layout = layout_of(flat)
        changed = torch.tensor(int(layout != self.layout or self.writer is None), device=self.manager.collectives)
        dist.all_reduce(changed, op=dist.ReduceOp.MAX)
        if not changed:
            return
        if layout != self.layout:
            self.staging.allocate(flat)
        planner, writer = DefaultSavePlanner(), ChecksummingWriter(folder)
        planner.set_up_planner(state_dict=state, storage_meta=writer.storage_meta(), is_coordinator=self.rank == 0)
        writer.set_up_storage_writer(self.rank == 0, rank=self.rank)
        plans: list[SavePlan] | None = [None] * dist.get_world_size() if self.rank == 0 else None  # type: ignore[list-item]
        dist.gather_object(writer.prepare_local_plan(planner.create_local_plan()), plans, dst=0)
        if self.rank == 0:
            plans, self.metadata = planner.create_global_plan(plans)
            plans = writer.prepare_global_plan(plans)
        mine: list[SavePlan | None] = [None]
        dist.scatter_object_list(mine, plans, src=0)
        self.plan, self.layout = planner.finish_plan(mine[0]), layout
        if self.writer is None:
            self.writer = WriterProcess()
        self.writer.setup(self.staging.buffers, self.plan)

    def poll(self) -> list[SaveDone]:
        """At a step boundary (every rank): one more step ran beside the save in flight; where it stands."""
        if self.pending is None:
            return []
        self.pending.overlap_steps += 1
        t0 = time.perf_counter()
        done = self.advance(block=False)
        if self.pending is not None:
            self.pending.blocking_s += time.perf_counter() - t0
        return done

    def finish(self) -> list[SaveDone]:
        """Wait until the save in flight is durable (the next save, a stop signal, the segment's end) and say how
        long that took."""
        if self.pending is None:
            return []
        t0, step = time.perf_counter(), self.pending.step
        done: list[SaveDone] = []
        while not done:
            done = self.advance(block=True)
        waited = time.perf_counter() - t0
        if self.rank == 0:
            log.info("Waited %.2f s for the checkpoint of step %d to be written", waited, step)
        return [dataclasses.replace(done[0], waited_s=waited)]

    def advance(self, *, block: bool) -> list[SaveDone]:
        """One agreement of every rank on the save in flight, and the next phase if every rank is ready for it."""
        p = self.pending
        running, failed = self.local_state(p, block=block)
        flags = torch.tensor([int(running), int(failed)], device=self.manager.collectives)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[1]:
            self.fail(p)
        if flags[0]:
            return []
        if p.phase == "writing":
            self.begin_commit(p)
            return []
        return [self.durable(p)]

    def local_state(self, p: Pending, *, block: bool) -> tuple[bool, bool]:
        """(still running, failed) of this rank's part: its copy and write, or rank 0's commit."""
        if p.phase == "committing":
            if self.rank != 0:
                return False, False
            if block:
                p.commit.exception()
            return not p.commit.done(), p.commit.done() and p.commit.result() is not None
        if p.written is None and p.failure is None:
            try:
                if block or self.staging.copying.done():
                    self.staging.wait()
                    p.written = self.writer.answer(block=block)
            except WriterDied as err:
                p.failure = (None, str(err), str(p.folder))
            except Exception as err:  # the background copy's, or its hand-off's to a writer that died
                dead = not self.writer.process.is_alive()
                p.failure = (None, self.writer.exit_text(), str(p.folder)) if dead else describe_failure(None, err)
            if p.written is not None and p.written.failure is not None:
                p.failure = p.written.failure
        return p.written is None and p.failure is None, p.failure is not None

    def begin_commit(self, p: Pending) -> None:
        """Every rank's write succeeded: the drill point, then every rank's results to rank 0, whose background
        thread writes .metadata and the manifest and publishes the folder."""
        p.before_commit()
        report = (p.written.results, p.written.checksums, p.nbytes, p.written.seconds)
        reports = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(report, reports, dst=0)
        if self.rank == 0:
            p.commit = self.manager.background.submit(self.commit, p, reports)
        p.phase = "committing"

    def commit(self, p: Pending, reports: list) -> str | None:
        """Rank 0, in the background thread: DCP's finish (.metadata, checksummed as written), then the manifest,
        fsync and rename of a synchronous save; the one-line error, or None."""
        t0 = time.perf_counter()
        writer = ChecksummingWriter(p.folder)
        writer.set_up_storage_writer(True, rank=0)
        try:
            writer.finish(self.metadata, [results for results, *_ in reports])
        except Exception as err:  # whatever it is, the main thread must hear of it as one line
            shutil.rmtree(p.folder, ignore_errors=True)
            needs = sum(n for *_, n, _ in reports)
            return self.manager.write_error(p.step, 0, describe_failure(*(writer.failure or (None, err))), needs=needs)
        checksums = [c for _, c, _, _ in reports]
        checksums[0] = {**checksums[0], **writer.checksums}
        error = self.manager.commit(
            p.step, p.folder, [(c, n, None) for c, (_, _, n, _) in zip(checksums, reports)], p.provenance
        )
        slowest = max(seconds for *_, seconds in reports)
        p.done = SaveDone(p.step, p.started, 0.0, p.step_s, slowest + time.perf_counter() - t0)
        return error

    def durable(self, p: Pending) -> SaveDone:
        """The boundary that saw the commit done: rank 0's record of the save, on every rank."""
        record = [
            SaveDone(p.step, p.started, p.blocking_s, p.step_s, p.done.background_s, overlap_steps=p.overlap_steps)
            if self.rank == 0
            else None
        ]
        dist.broadcast_object_list(record, src=0)
        self.pending = None
        return record[0]

    def fail(self, p: Pending) -> None:
        """Some rank's part failed: stop every writer, remove the folder, the same one line on every rank."""
        if p.phase == "writing" and self.writer is not None:
            self.writer.kill()  # its write would go on into a folder being removed
            self.writer = None
        reports = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object((p.failure, p.nbytes), reports, dst=0)
        error = [None]
        if self.rank == 0:
            if p.phase == "committing":
                error[0] = p.commit.result()
            else:
                shutil.rmtree(p.folder, ignore_errors=True)
                rank, failure = next((r, f) for r, (f, _) in enumerate(reports) if f is not None)
                error[0] = self.manager.write_error(p.step, rank, failure, needs=sum(n for _, n in reports))
        dist.broadcast_object_list(error, src=0)
        self.pending = None
        raise CheckpointWriteError(error[0])

    def wait_staged(self) -> None:
        """Before anything writes into the live state (a load): the background copy of it must be done."""
        self.staging.settle()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.staging.close()


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """What only the optimizer's step changes: its parameters and the tensors of its state."""
    params = [p for group in opt.param_groups for p in group["params"]]
    return params + [v for p in params for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
