"""A segment's checkpoints as the training loop sees them: where it resumes from (or step 0 from io.init_from), with
what besides the tensors (the data stream's position, the schedule, the guard: train.resume), when it saves (the
planned interval), rolling back past a loss spike, and what each save cost.

    ckpt = SegmentCheckpoints(cfg, device, model, optimizers, guard, recorder, span=span, weights=weights)
    step = ckpt.resume()            # the newest verified checkpoint at or before the segment's end; its start: none
    ckpt.stream.take(rows)          # the next step's data (data.stream); ckpt.schedule.lr_at(step)
    ckpt.save(step)                 # sync: durable on return; async: staged, written in the background
    ckpt.poll()                     # async: every step boundary, records the saves that became durable
    ckpt.finish()                   # the segment's end: the save in flight durable, the manager closed
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from trainflow.campaign.segments import SegmentSpan, carries_scaling, start_point
from trainflow.checkpoint.folders import step_dir
from trainflow.checkpoint.hf_reader import load_hf
from trainflow.checkpoint.interval import IntervalPlanner, SaveDone, file_system_mtbf_s
from trainflow.checkpoint.manager import CheckpointManager, CorruptFileError
from trainflow.checkpoint.manifest import MANIFEST, Manifest, Provenance, read_manifest, scaling_mismatch
from trainflow.checkpoint.state import build_state, load_state, state_bytes
from trainflow.code_version import CodeVersion
from trainflow.config import TrainflowConfig
from trainflow.config.identity import changes, settings
from trainflow.config.run_folder import RunFolder
from trainflow.data.stream import DataStream
from trainflow.errors import TrainflowError
from trainflow.parallel import Parallelized
from trainflow.train.faults import maybe_inject_fault
from trainflow.train.guard import DivergenceError, GuardEvent, GuardState, LossGuard, read_guard_state
from trainflow.train.recorder import StepRecorder
from trainflow.train.resume import carried_changes, job_settings, recorded_settings, resumed_schedule, stream_position
from trainflow.train.summary import SaveRecord

log = logging.getLogger(__name__)


class ResumeError(TrainflowError):
    """No checkpoint to continue from."""


@dataclass
class SegmentCheckpoints:
    cfg: TrainflowConfig
    device: torch.device
    model: Parallelized
    optimizers: list[torch.optim.Optimizer]
    guard: LossGuard
    recorder: StepRecorder
    on_phase: Callable[[str, int], None]
    attempt: int
    is_logger: bool
    span: SegmentSpan
    weights: dict[str, float]
    """The stream's sources and their weights, in the token index's order (data.sampler's names)."""

    def __post_init__(self) -> None:
        cfg, c = self.cfg, self.cfg.checkpoint
        self.start_step, self.end_step = self.span.start, self.span.end
        self.manager = CheckpointManager(
            cfg.io.checkpoints,
            keep=c.keep,
            pinned=set(self.span.pinned),
            io_threads=c.io_threads,
            mode=c.mode,
            device=self.device,
            staging_bytes=state_bytes(self.model.named_parts()),  # async: refused at start-up where it cannot fit
        )
        self.planner = IntervalPlanner(
            mtbf_s=file_system_mtbf_s(cfg), fixed_steps=c.interval_steps, max_steps=c.max_interval_steps
        )
        self.saves: list[SaveRecord] = []
        self.rollbacks: list[GuardEvent] = []
        """This job's rollbacks (resilience.max_rollbacks bounds them)."""
        self.init_from: str | None = None
        """The Hugging Face folder step 0's weights came from (io.init_from), carried on by every manifest."""
        self.opened = False
        """Whether the job loaded its series' start from a parent phase's checkpoint (the trainer then saves it as
        the series' first checkpoint, resharded into this layout: campaign.segments.start_point)."""
        self.stream = DataStream(stream_position(None, 0, cfg, self.weights), weights=self.weights, seed=cfg.train.seed)
        self.schedule = resumed_schedule(None, cfg, horizon=self.span.horizon, step=0)

    def state(self, step: int = 0) -> dict:
        return build_state(self.model.named_parts(), self.optimizers, step=step)

    def resume(self) -> int:
        """Load the newest verified checkpoint at or before the segment's end (a branch's first: its parent's); its
        step (the segment's start where there is none: step 0, from io.init_from or fresh weights)."""
        step, manifest = self.load(at_most=self.end_step, why="Resumed from")
        if step < 0 and self.start_step > 0:
            raise ResumeError(
                f"segment {self.cfg.segment} starts at step {self.start_step} but {self.cfg.io.checkpoints} "
                f"holds no valid checkpoint at or before step {self.end_step}; rerun segment "
                f"{self.cfg.segment - 1} or set io.resume_from=<another run's checkpoint folder>"
            )
        if step < 0 and self.cfg.io.init_from:
            self.initialise()
        step = max(step, 0)
        self.restore(manifest, step)
        self.schedule = resumed_schedule(manifest, self.cfg, horizon=self.span.horizon, step=step)
        changed = changes(recorded_settings(manifest), job_settings(self.cfg, self.schedule))
        if self.opened and manifest is not None:
            changed += carried_changes(manifest, self.cfg)
        self.recorder.changes(step, changed)
        return step

    def restore(self, manifest: Manifest | None, step: int, skipped: list[list[int]] = ()) -> None:
        """The guard and the stream as checkpoint `step` (its `manifest`; None: the start) left them, the data ranges
        `skipped` left out besides."""
        self.guard.restore(read_guard_state(manifest) if manifest else GuardState(losses=[]))
        position = stream_position(manifest, step, self.cfg, self.weights)
        self.stream = DataStream(position, weights=self.weights, seed=self.cfg.train.seed)
        self.stream.skip(skipped)

    def initialise(self) -> None:
        """Step 0 from io.init_from's Hugging Face weights, resharded to this layout; the optimizer starts fresh."""
        started = time.time()
        self.on_phase("load", 0)
        load_hf(Path(self.cfg.io.init_from), self.model.named_parts(), self.cfg.model)
        self.init_from = self.cfg.io.init_from
        self.recorder.span("load", 0, started, time.time() - started)

    def load(self, at_most: int, why: str) -> tuple[int, Manifest | None]:
        """Load the newest verified checkpoint at or before `at_most` (this series', else a branch's parent's at the
        branch's step, else io.resume_from's, resharded to this layout); its step and manifest (-1 and None: none). A
        checkpoint whose file fails its CRC as it is read is skipped for the next older one, as one whose manifest is
        not complete is (CheckpointManager.newest_complete); a parent's must be the branch's step itself."""
        for source, most, exact in self.sources(at_most):
            step = source.newest_complete(at_most=most)
            while step >= 0 and (not exact or step == most):
                try:
                    return self.load_step(source, step, why)
                except CorruptFileError as err:  # raised alike on every rank (checkpoint.single_read)
                    if self.is_logger:
                        log.warning("Skipped checkpoint step %d: %s", step, err)
                    step = source.newest_complete(at_most=step - 1)
            if exact:
                raise ResumeError(
                    f"the branch's parent {source.root} holds no verified checkpoint of step {most} any more; branch "
                    "from another (train.branch_from)"
                )
        return -1, None

    def sources(self, at_most: int) -> Iterator[tuple[CheckpointManager, int, bool]]:
        """Where a load looks, in order, with the newest step to take from each and whether it must be that one: this
        series' checkpoints, a branch's parent's at the branch's step (before the branch saves its own), then
        io.resume_from's."""
        yield self.manager, at_most, False
        threads = self.cfg.checkpoint.io_threads
        if (point := start_point(self.cfg)) is not None and at_most >= point[1]:
            parent = RunFolder.of(self.cfg).series_checkpoints(point[0])
            yield CheckpointManager(parent, keep=0, pinned=set(), io_threads=threads), point[1], True
        if self.cfg.io.resume_from:
            yield CheckpointManager(self.cfg.io.resume_from, keep=0, pinned=set(), io_threads=threads), at_most, False

    def load_step(self, source: CheckpointManager, step: int, why: str) -> tuple[int, Manifest]:
        """Load checkpoint `step` of `source` into the model and optimizers; the step loaded and its manifest."""
        started = time.time()
        self.on_phase("load", step)
        folder = step_dir(source.root, step)
        manifest = read_manifest(folder)  # every rank reads it: no collective to agree
        carried = carries_scaling(self.cfg, manifest.series)  # a later phase may extend its parent's context
        self.opened = carried
        if not carried and (mismatch := scaling_mismatch(folder / MANIFEST, manifest, self.cfg.model)):
            raise ResumeError(mismatch)
        self.init_from = manifest.init_from
        state = self.state()
        source.load(step, state)
        loaded = load_state(self.model.named_parts(), self.optimizers, state)
        self.recorder.span("load", loaded, started, time.time() - started)
        if self.is_logger:
            log.info("%s the checkpoint of step %d in %s", why, loaded, source.root)
        return loaded, manifest

    def rollback(self) -> int:
        """After train.spike.rollback_after bad steps in a row: reload the newest verified checkpoint from before the
        first of them and leave their data windows out of the stream (train.guard); the step to go on from."""
        first, bad = self.guard.first_bad, self.guard.bad
        if len(self.rollbacks) >= (limit := self.cfg.resilience.max_rollbacks):
            done = ", ".join(f"{e.from_step} to {e.step}" for e in self.rollbacks)
            raise DivergenceError(
                f"the loss diverges: {len(bad)} bad steps in a row from step {first} (the last: {bad[-1][2]}) after "
                f"{len(self.rollbacks)} rollback(s) (from steps {done or 'none'}), past resilience.max_rollbacks "
                f"({limit}); lower optim.lr, raise train.spike.factor, or check the data"
            )
        skipped = self.stream.position.skipped  # earlier rollbacks' too: the checkpoint may predate them
        step, manifest = self.load(at_most=first, why="Rolled back to")
        if step < 0:
            raise DivergenceError(
                f"{len(bad)} bad steps in a row from step {first} (the last: {bad[-1][2]}) and no verified checkpoint "
                f"at or before step {first} to roll back to; lower optim.lr, raise train.spike.factor or "
                "train.spike.rollback_after, or check the data"
            )
        event = self.guard.rolled_back(step)
        self.restore(manifest, step, [*skipped, *event.windows])
        self.rollbacks.append(event)
        done, removed = self.manager.discard_after(step)
        self.saved(done)
        if removed and self.is_logger:
            log.info("Removed the checkpoints of steps %s, saved inside the bad run", ", ".join(map(str, removed)))
        self.recorder.resume(step)
        self.recorder.guard(event)
        return step

    def save(self, step: int) -> None:
        self.on_phase("save", step)
        started = time.time()
        done = self.manager.save(
            step,
            self.state(step),
            optimizers=self.optimizers,  # async: their next step waits for the background copy of their tensors
            step_s=self.planner.step_s,
            before_commit=lambda: maybe_inject_fault(self.cfg.fault, step, during_save=True, attempt=self.attempt),
            provenance=Provenance(
                layout=self.cfg.parallel.name,
                model=self.cfg.model,  # what trainflow.export rebuilds the model from
                guard=self.guard.state(),  # what a resume from it judges with (train.guard)
                init_from=self.init_from,  # where step 0 came from (io.init_from)
                series=RunFolder.of(self.cfg).series,
                stream=self.stream.position,  # where a resume from it draws on (data.stream)
                schedule=self.schedule,
                settings=settings(self.cfg),  # what the next segment's changes are against
                code=CodeVersion.here(),
            ),
        )
        self.recorder.span("save", step, started, time.time() - started)  # the time the loop was blocked
        self.saved(done)

    def poll(self) -> None:
        """Async: record the saves in flight that became durable, agreed by every rank (sync: none)."""
        self.saved(self.manager.poll())

    def finish(self) -> None:
        """Async: wait until the save in flight is durable, before the segment ends; then close the manager."""
        self.saved(self.manager.finish())
        self.manager.close()

    def saved(self, done: list[SaveDone]) -> None:
        """Record the saves that became durable (in sync mode the one just taken; in async mode at a later step
        boundary, or where training stops) and plan the next interval from them."""
        before = self.planner.interval_steps
        for d in done:
            self.saves.append(SaveRecord(d.step, d.started, d.blocking_s, d.background_s, d.waited_s, d.overlap_steps))
            self.planner.observe_save(d.blocking_s, step_s=d.step_s, background_s=d.background_s)
        plan = self.planner.describe()
        if self.is_logger and plan.interval_steps != before:
            log.info(
                "Planned a checkpoint every %d steps (%s: save %.2f s, step %.3f s, MTBF %.1f h%s)",
                plan.interval_steps,
                plan.policy,
                plan.save_s,
                plan.step_s,
                plan.mtbf_s / 3600,
                f" -> sqrt(2 x save x MTBF) = {plan.interval_s:.0f} s" if plan.interval_s else "",
            )
