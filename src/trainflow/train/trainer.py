"""The training loop of one segment, run by every rank: train / train_step, resume, checkpoint.

    python -m trainflow.stages.train_segment segment=0 parallel=dp2_tp2_pp2

A segment trains steps [segment * segment_steps, (segment + 1) * segment_steps), resuming from the
newest verified checkpoint at or before its end. The batch of a step is a pure function of (seed, step
and the data windows the loss guard left out), the learning rate a pure function of the step, and the model
has no dropout: so model, optimizer, step and the guard's state (in the checkpoint's manifest) are all a resumed
run needs to continue bit for bit. Every step is judged by the loss guard before it is applied (train.guard).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist

from trainflow.checkpoint.folders import step_dir
from trainflow.checkpoint.interval import IntervalPlanner, SaveDone
from trainflow.checkpoint.manager import CheckpointManager
from trainflow.checkpoint.manifest import read_manifest
from trainflow.checkpoint.state import build_state, load_state, state_bytes, state_digest
from trainflow.config import ParallelDims, TrainflowConfig, as_dict
from trainflow.config.shape import flops_per_token, mfu
from trainflow.config.sources import sources_of
from trainflow.data.mixture import SourceShare, realised
from trainflow.data.sampler import TokenSampler
from trainflow.errors import TrainflowError
from trainflow.export.hf_import import load_hf, recorded_init_from
from trainflow.fp8 import backend_reason
from trainflow.parallel import Parallelized
from trainflow.train.build import build_model
from trainflow.train.clock import ForwardClock
from trainflow.train.controls import StopFlag, build_optimizer, lr_at, set_determinism
from trainflow.train.faults import maybe_inject_fault, maybe_poison, maybe_slow
from trainflow.train.guard import DivergenceError, GuardState, LossGuard, read_guard_state
from trainflow.train.profile import memory_mb
from trainflow.train.recorder import StepRecorder
from trainflow.train.step_log import StepRecord
from trainflow.train.summary import Fp8Use, ProfileSummary, SaveRecord, SegmentSummary

log = logging.getLogger(__name__)


class ResumeError(TrainflowError):
    """No checkpoint to continue from."""


@dataclass
class Trainer:
    cfg: TrainflowConfig
    device: torch.device
    on_phase: Callable[[str, int], None] = lambda kind, step: None
    """Told (kind, step) when the loop enters a step's data loading or compute, an evaluation, a save or a load:
    energy.node's window (DVFS acts on data and compute) and launch.heartbeat's progress."""
    on_step: Callable[[StepRecord], None] = lambda record: None
    """Told each step's record, on every rank (launch.heartbeat keeps each rank's compute time: stragglers)."""
    attempt: int = 0
    """Which job of the segment this is: fault drills strike in the first only (train.faults)."""
    model: Parallelized = field(init=False)
    optimizers: list[torch.optim.Optimizer] = field(init=False)

    def __post_init__(self) -> None:
        cfg, t = self.cfg, self.cfg.train
        set_determinism(seed=t.seed, deterministic=t.deterministic, threads=t.threads_per_rank)
        self.dims = ParallelDims.from_config(
            cfg.parallel, cfg.model, world_size=dist.get_world_size(), global_batch=t.global_batch
        )
        self.mesh = self.dims.build_mesh(self.device.type)
        self.rank, self.is_logger = dist.get_rank(), dist.get_rank() == 0
        self.model, self.parameters, self.offloader = build_model(cfg, self.device, self.dims, self.mesh, self.rank)
        self.clock = ForwardClock(self.model.named_parts(), self.device)
        maybe_slow(cfg.fault, self.model.named_parts())
        self.optimizers = [build_optimizer(part, cfg.optim, self.device) for part in self.model.parts]
        dp_rank, rows = self.mesh["dp"].get_local_rank(), self.dims.local_batch(t.global_batch)
        self.rows = slice(dp_rank * rows, (dp_rank + 1) * rows)
        self.sampler = TokenSampler(
            cfg.io.staged_tokens,
            seq_len=cfg.model.seq_len,
            seed=t.seed,
            cross_document=t.cross_document,
            weights={s.name: s.weight for s in sources_of(cfg.data)},
        )
        self.start_step = cfg.segment * t.segment_steps
        self.end_step = self.start_step + t.segment_steps
        self.build_records()

    def build_records(self) -> None:
        """Checkpoints and their interval, the stop signal, what the segment records of itself."""
        cfg, t, c = self.cfg, self.cfg.train, self.cfg.checkpoint
        ends = {(s + 1) * t.segment_steps for s in range(t.segments)}
        self.checkpoints = CheckpointManager(
            cfg.io.checkpoints,
            keep=c.keep,
            pinned=ends,
            io_threads=c.io_threads,
            mode=c.mode,
            device=self.device,
            staging_bytes=state_bytes(self.model.named_parts()),  # async: refused at start-up where it cannot fit
        )
        self.planner = IntervalPlanner(
            mtbf_s=cfg.cluster.hardware.mtbf_hours * 3600,
            fixed_steps=c.interval_steps,
            max_steps=c.max_interval_steps,
        )
        self.stop = StopFlag()
        self.saves: list[SaveRecord] = []
        self.guard = LossGuard(t.spike)
        self.recorder = StepRecorder(cfg, rank=self.rank, device=self.device)
        self.init_from: str | None = None
        """The Hugging Face folder step 0's weights came from (io.init_from), carried on by every manifest."""

    # -- state ---------------------------------------------------------------------------------

    def state(self, step: int = 0) -> dict:
        return build_state(self.model.named_parts(), self.optimizers, step=step)

    def resume(self) -> int:
        """Load the newest verified checkpoint at or before the segment's end; its step (0: none, at the start)."""
        step, guard = self.load(at_most=self.end_step, why="Resumed from")
        if step < 0 and self.start_step > 0:
            raise ResumeError(
                f"segment {self.cfg.segment} starts at step {self.start_step} but {self.cfg.io.checkpoints} "
                f"holds no valid checkpoint at or before step {self.end_step}; rerun segment "
                f"{self.cfg.segment - 1} or set io.resume_from=<another run's checkpoint folder>"
            )
        if step < 0 and self.cfg.io.init_from:
            self.initialise()
        self.guard.restore(guard)
        return max(step, 0)

    def initialise(self) -> None:
        """Step 0 from io.init_from's Hugging Face weights, resharded to this layout; the optimizer starts fresh."""
        started = time.time()
        self.on_phase("load", 0)
        load_hf(Path(self.cfg.io.init_from), self.model.named_parts(), self.cfg.model)
        self.init_from = self.cfg.io.init_from
        self.recorder.span("load", 0, started, time.time() - started)

    def load(self, at_most: int, why: str) -> tuple[int, GuardState]:
        """Load the newest verified checkpoint at or before `at_most` (this run's, else io.resume_from's, resharded
        to this layout); its step and the guard state its manifest holds (-1 and an empty one: none)."""
        source, step = self.checkpoints, self.checkpoints.newest_valid(at_most=at_most)
        if step < 0 and self.cfg.io.resume_from:
            source = CheckpointManager(
                self.cfg.io.resume_from, keep=0, pinned=set(), io_threads=self.cfg.checkpoint.io_threads
            )
            step = source.newest_valid(at_most=at_most)
        if step < 0:
            return -1, GuardState(skipped=[], losses=[])
        started = time.time()
        self.on_phase("load", step)
        folder = step_dir(source.root, step)
        manifest = read_manifest(folder)
        guard = read_guard_state(manifest, str(folder))  # every rank reads it: no collective to agree
        self.init_from = recorded_init_from(manifest)
        state = self.state()
        source.load(step, state)
        loaded = load_state(self.model.named_parts(), self.optimizers, state)
        self.recorder.span("load", loaded, started, time.time() - started)
        if self.is_logger:
            log.info("%s the checkpoint of step %d in %s", why, loaded, source.root)
        return loaded, guard

    def rollback(self) -> int:
        """After train.spike.rollback_after bad steps in a row: reload the newest verified checkpoint from before the
        first of them and leave their data windows out of the stream (train.guard); the step to go on from."""
        first, bad = self.guard.first_bad, self.guard.bad
        step, state = self.load(at_most=first, why="Rolled back to")
        if step < 0:
            raise DivergenceError(
                f"{len(bad)} bad steps in a row from step {first} (the last: {bad[-1][2]}) and no verified checkpoint "
                f"at or before step {first} to roll back to; lower optim.lr, raise train.spike.factor or "
                "train.spike.rollback_after, or check the data"
            )
        event = self.guard.rolled_back(step, state)
        self.recorder.resume(step)
        self.recorder.guard(event)
        return step

    def save(self, step: int) -> None:
        self.on_phase("save", step)
        started = time.time()
        done = self.checkpoints.save(
            step,
            self.state(step),
            optimizers=self.optimizers,  # async: their next step waits for the background copy of their tensors
            step_s=self.planner.step_s,
            before_commit=lambda: maybe_inject_fault(self.cfg.fault, step, during_save=True, attempt=self.attempt),
            layout=self.cfg.parallel.name,
            model=as_dict(self.cfg.model),  # what trainflow.export rebuilds the model from
            guard=self.guard.state().to_json(),  # what a resume from it judges and draws with (train.guard)
            init_from=self.init_from,  # where step 0 came from (io.init_from)
        )
        self.recorder.span("save", step, started, time.time() - started)  # the time the loop was blocked
        self.saved(done)

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

    # -- loop ----------------------------------------------------------------------------------

    def train_step(self, step: int) -> StepRecord:
        start, started = time.perf_counter(), time.time()
        self.on_phase("data", step)
        lr = lr_at(step, self.cfg.optim, self.cfg.train.total_steps)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        window = self.guard.window(step)
        inputs, targets = self.sampler.batch("train", window, self.cfg.train.global_batch, self.rows)
        data_s = time.perf_counter() - start
        self.on_phase("compute", step)
        self.clock.reset()
        loss, times = self.model.forward_backward(inputs.to(self.device), targets.to(self.device))
        maybe_poison(self.cfg.fault, window, loss, self.model.parameters())
        grad_norm = self.model.clip_grad_norm(self.cfg.optim.grad_clip)
        skipped = self.guard.judge(step, window, float(loss), grad_norm)  # global loss and norm: every rank agrees
        for opt in self.optimizers:
            if skipped is None:
                opt.step()
            opt.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        tokens = self.cfg.train.global_batch * self.cfg.model.seq_len
        return StepRecord(
            step=step,
            started=started,
            loss=float(loss),
            lr=lr,
            grad_norm=grad_norm,
            step_s=seconds,
            tokens_per_s=tokens / seconds,
            mfu=self.mfu(tokens / seconds / self.dims.world_size),
            memory_mb=memory_mb(self.device),
            data_s=data_s,
            compute_s=times.compute,
            dp_comm_s=times.dp_comm,
            bubble_s=times.bubble,
            activation_s=times.activation,
            forward_s=self.clock.take(),
            skipped=skipped,
        )

    def evaluate(self, step: int) -> float:
        """Each source's validation loss (train.eval_batches batches of its own split) and their weighted mean."""
        started = time.time()
        self.on_phase("eval", step)
        per_source = {}
        for k, name in enumerate(self.sampler.names):
            losses = []
            for i in range(self.cfg.train.eval_batches):
                inputs, targets = self.sampler.batch("val", i, self.cfg.train.global_batch, self.rows, source=k)
                losses.append(float(self.model.eval_loss(inputs.to(self.device), targets.to(self.device))))
            per_source[name] = sum(losses) / len(losses)
        weights = dict(zip(self.sampler.names, self.sampler.weights))
        val = sum(weights[n] * loss for n, loss in per_source.items()) / sum(weights.values())
        self.recorder.evaluation(step, val, started, time.time() - started, sources=per_source)
        return val

    def train(self) -> SegmentSummary:
        """Train to the segment's end, or until a stop signal; the segment's summary."""
        t = self.cfg.train
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGUSR2, signal.SIGTERM)}
        step = self.resume()
        self.recorder.resume(step)
        if step == 0:
            self.evaluate(0)
        since_save, stop_signal = 0, 0
        while step < self.end_step:
            maybe_inject_fault(self.cfg.fault, step, during_save=False, attempt=self.attempt)
            record = self.train_step(step)
            step += 1
            since_save += 1
            self.recorder.step(record)
            self.on_step(record)
            self.planner.observe_step(record.step_s)
            self.saved(self.checkpoints.poll())  # async: where the save in flight stands, agreed
            if record.skipped and self.guard.rollback_due:
                step, since_save = self.rollback(), 0
                continue
            if record.skipped:
                self.recorder.guard(self.guard.skip_event())
            if step % t.eval_every == 0 or step == self.end_step:
                self.evaluate(step)
            if stop_signal := self.stop.agreed():
                self.save(step)
                break
            if step == self.end_step or self.planner.due(since_save):
                self.save(step)
                since_save = 0
        # After the last step a pre-timeout USR2 stays with the stop flag, unread: submitit's handler would requeue a
        # finished segment (seen when the signal came while the last checkpoint was closing).
        for sig, handler in previous.items():
            if stop_signal or sig != signal.SIGUSR2:
                signal.signal(sig, handler)
        self.saved(self.checkpoints.finish())  # async: the save in flight is durable before the segment ends
        self.sampler.close()
        self.checkpoints.close()
        if self.offloader is not None:
            self.offloader.close()
        return self.summary(step, stop_signal, profile=self.recorder.close())

    def mfu(self, tokens_per_s_per_device: float) -> float:
        return mfu(self.cfg.model, tokens_per_s_per_device, peak_tflops=self.cfg.cluster.hardware.peak_tflops)

    def summary(self, step: int, stop_signal: int, *, profile: ProfileSummary | None) -> SegmentSummary:
        """The segment's record; its step records are rank 0's (the other ranks report none)."""
        t = self.cfg.train
        steps = self.recorder.steps()
        step_s = median(r.step_s for r in steps[1:] or steps) if steps else float("nan")
        tokens_per_device = t.global_batch * self.cfg.model.seq_len / step_s / self.dims.world_size
        return SegmentSummary(
            segment=self.cfg.segment,
            start_step=self.start_step,
            end_step=step,
            completed=step == self.end_step,
            interrupted_by=signal.Signals(stop_signal).name if stop_signal else None,
            restart_count=int(os.environ.get("SLURM_RESTART_COUNT", 0)),
            layout=self.dims,
            parameters=self.parameters,
            precision=t.precision,
            activations=t.activations,
            compile=t.compile,
            fp8=Fp8Use(t.fp8, self.model.fp8_backend, backend_reason(self.device) if t.fp8 != "none" else None),
            flops_per_token=flops_per_token(self.cfg.model),
            median_step_s=step_s,
            tokens_per_s_per_device=tokens_per_device,
            mfu=self.mfu(tokens_per_device),
            checkpoint_interval=self.planner.describe(),
            state_digest=state_digest(self.state()),
            profile=profile,
            saves=self.saves,
            steps=steps,
            evals=self.recorder.evals(),
            guard=self.recorder.guard_events(),
            ranks=self.recorder.rank_timings(),
            init_from=self.init_from,
            mixture=self.mixture(steps),
        )

    def mixture(self, steps: list[StepRecord]) -> list[SourceShare]:
        """The realised mixture of the segment's applied steps (rank 0's records): their windows' rows by source."""
        t, names, weights = self.cfg.train, self.sampler.names, self.sampler.weights
        windows = [self.guard.window(r.step) for r in steps if r.skipped is None]
        return realised(
            names, weights, seed=t.seed, windows=windows, rows=t.global_batch, seq_len=self.cfg.model.seq_len
        )
