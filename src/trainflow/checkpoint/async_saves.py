"""checkpoint.mode=async (checkpoint.saves' SaveMode.ASYNC): the save in flight and its way to durable, step boundary
by step boundary (checkpoint.background says why it is built so): stage, write in the background, agree, commit,
agree.

    python -m pytest tests/unit/test_checkpoint_async.py -k durable

Every rank calls `start` at the same steps, then `poll` at every step boundary (one all_reduce of where its part
stands, while a save is in flight) and `finish` where training stops; every rank takes the same branch at every
boundary, so they run the same collectives. Phases: writing (the background copy and this rank's writer process),
then, once every rank's write succeeded, committing (rank 0's Committer.commit, the synchronous save's, in its
background thread), then durable: the boundary that sees the commit done returns the SaveDone, rank 0's measurements
on every rank.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.tensor import DTensor

from trainflow.checkpoint.background import WriterDied, WriterProcess, Written
from trainflow.checkpoint.commit import Committer, SaveRequest
from trainflow.checkpoint.interval import SaveDone
from trainflow.checkpoint.saves import Saves
from trainflow.checkpoint.staging import Staging, check_host_memory
from trainflow.checkpoint.writer import (
    CheckpointWriteError,
    ChecksummingWriter,
    RankReport,
    WriteFailure,
    describe_failure,
    planned_bytes,
)
from trainflow.tensors import local, storage_ptr

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    WRITING = "writing"
    """The background copy and this rank's writer process."""
    COMMITTING = "committing"
    """Every rank's write succeeded; rank 0's commit runs in its background thread."""


@dataclass
class Pending:
    """The save in flight, on this rank."""

    request: SaveRequest
    blocking_s: float = 0.0
    phase: Phase = Phase.WRITING
    overlap_steps: int = 0
    written: Written | None = None
    failure: WriteFailure | None = None
    """This rank's, once its part failed."""
    commit: Future | None = None
    """Rank 0: the commit in its background thread; its result is the one-line error or None."""
    background_s: float | None = None
    """Rank 0, once committed: the slowest rank's write plus the commit."""


def layout_of(flat: dict) -> tuple:
    """What the cached save plan depends on: every entry's name, kind, shape and dtype, and this rank's part."""
    return tuple(
        (k, isinstance(v, DTensor), tuple(v.shape), v.dtype, tuple(local(v).shape), tuple(local(v).stride()))
        for k, v in flat.items()
    )


class AsyncSaves(Saves):
    """One rank's side of checkpoint.mode=async. `staging_bytes` (this rank's state, checkpoint.state's state_bytes)
    is checked against the host's free memory first, on every rank (a collective); `collectives` is where the small
    tensors of its agreements live (NCCL takes device tensors only)."""

    def __init__(
        self,
        committer: Committer,
        *,
        io_threads: int,
        device: torch.device,
        collectives: torch.device,
        staging_bytes: int | None,
    ) -> None:
        super().__init__(committer, io_threads=io_threads)
        if staging_bytes is not None:
            check_host_memory(staging_bytes)
        self.collectives = collectives
        self.staging = Staging(device)
        self.writer: WriterProcess | None = None
        self.layout: tuple | None = None
        self.plan: SavePlan | None = None
        self.metadata: Metadata | None = None
        """Rank 0: the global metadata of the cached plan, which the commit completes and writes."""
        self.pending: Pending | None = None
        self.hooked: set[int] = set()

    def save(self, step, state, *, optimizers, step_s, before_commit, provenance) -> list[SaveDone]:
        """Stage `state` and hand it to the writer process; the save in flight before it (waited for: one at a
        time) if there was one."""
        done = self.finish()
        t0 = time.perf_counter()
        flat, _ = flatten_state_dict(state)
        if bad := next((k for k, v in flat.items() if not isinstance(v, torch.Tensor)), None):
            raise TypeError(f"async saves stage tensors only: {bad!r} is a {type(flat[bad]).__name__}")
        request = self.committer.prepare(
            step, provenance=provenance, before_commit=before_commit, step_s=step_s, nbytes=0
        )
        folder = request.folder
        self.replan(state, flat, folder)  # collective: also, every rank sees the folder rank 0 made
        request = dataclasses.replace(request, nbytes=planned_bytes(self.plan))  # replicas written once
        for opt in optimizers:
            if id(opt) not in self.hooked:  # the optimizer's next step waits for the background copy of its tensors
                opt.register_step_pre_hook(lambda *_: self.before_optimizer_step())
                self.hooked.add(id(opt))
        deferred = {storage_ptr(t) for opt in optimizers for t in optimizer_tensors(opt)}
        writer, threads = self.writer, self.io_threads
        self.staging.start(flat, deferred=deferred, then=lambda: writer.write(folder, threads))
        self.pending = Pending(request, blocking_s=time.perf_counter() - t0)
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
        changed = torch.tensor(int(layout != self.layout or self.writer is None), device=self.collectives)
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
        t0, step = time.perf_counter(), self.pending.request.step
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
        flags = torch.tensor([int(running), int(failed)], device=self.collectives)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[1]:
            self.fail(p)
        if flags[0]:
            return []
        if p.phase is Phase.WRITING:
            self.begin_commit(p)
            return []
        return [self.durable(p)]

    def local_state(self, p: Pending, *, block: bool) -> tuple[bool, bool]:
        """(still running, failed) of this rank's part: its copy and write, or rank 0's commit."""
        if p.phase is Phase.COMMITTING:
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
                p.failure = WriteFailure(None, str(err), str(p.request.folder))
            except Exception as err:  # the background copy's, or its hand-off's to a writer that died
                dead = not self.writer.process.is_alive()
                died = WriteFailure(None, self.writer.exit_text(), str(p.request.folder))
                p.failure = died if dead else describe_failure(None, err)
            if p.written is not None and p.written.failure is not None:
                p.failure = p.written.failure
        return p.written is None and p.failure is None, p.failure is not None

    def begin_commit(self, p: Pending) -> None:
        """Every rank's write succeeded: the drill point, then every rank's report to rank 0, whose background
        thread writes .metadata and commits."""
        p.request.before_commit()
        w = p.written
        reports = self.committer.gather(RankReport(w.checksums, p.request.nbytes, None, w.results, w.seconds))
        if reports is not None:
            p.commit = self.committer.background.submit(self.commit, p, reports)
        p.phase = Phase.COMMITTING

    def commit(self, p: Pending, reports: list[RankReport]) -> str | None:
        """Rank 0, in the background thread: DCP's finish (.metadata, checksummed as written), then the commit a
        synchronous save ends in; the one-line error, or None."""
        t0 = time.perf_counter()
        writer = ChecksummingWriter(p.request.folder)
        writer.set_up_storage_writer(True, rank=0)
        try:
            writer.finish(self.metadata, [r.results for r in reports])
            mine = dataclasses.replace(reports[0], checksums={**reports[0].checksums, **writer.checksums})
        except Exception as err:  # whatever it is, the main thread must hear of it as one line
            mine = dataclasses.replace(reports[0], failure=writer.failure or describe_failure(None, err))
        error = self.committer.commit(p.request, [mine, *reports[1:]])
        p.background_s = max(r.seconds for r in reports) + time.perf_counter() - t0
        return error

    def durable(self, p: Pending) -> SaveDone:
        """The boundary that saw the commit done: rank 0's record of the save, on every rank."""
        r = p.request
        done = SaveDone(r.step, r.started, p.blocking_s, r.step_s, p.background_s, overlap_steps=p.overlap_steps)
        record = [done if self.rank == 0 else None]
        dist.broadcast_object_list(record, src=0)
        self.pending = None
        return record[0]

    def fail(self, p: Pending) -> None:
        """Some rank's part failed: stop every writer, remove the folder, the same one line on every rank."""
        if p.phase is Phase.WRITING and self.writer is not None:
            self.writer.kill()  # its write would go on into a folder being removed
            self.writer = None
        reports = self.committer.gather(RankReport({}, p.request.nbytes, p.failure))
        error = [None]
        if reports is not None:  # rank 0: the commit's own error, or the commit of the failed reports
            error[0] = p.commit.result() if p.phase is Phase.COMMITTING else self.committer.commit(p.request, reports)
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
