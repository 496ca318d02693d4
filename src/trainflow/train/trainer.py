"""The training loop of one segment, run by every rank: train / train_step / evaluate, and the segment's summary
(its checkpoints, resume and rollback: train.checkpointing).

    python -m trainflow.stages.train_segment segment=0 parallel=dp2_tp2_pp2

A segment trains steps [start, start + segment_steps), from where the segment before it ended (campaign.segments),
resuming from the newest verified checkpoint at or before its end. The batch of a step is a pure function of the
seed and the training stream's position (data.stream), the learning rate of the step and the schedule the checkpoint
carries (config.schedule), and the model has no dropout: so model, optimizer, step, the stream's position, the
schedule and the guard's state (in the checkpoint's manifest) are all a resumed run needs to continue bit for bit,
at any layout. Every step is judged by the loss guard before it is applied (train.guard).
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

import numpy as np
import torch
import torch.distributed as dist

from trainflow.campaign.segments import segment_span
from trainflow.checkpoint.state import state_digest
from trainflow.config import ParallelDims, TrainflowConfig
from trainflow.config.layout import cp_chunks
from trainflow.config.run_folder import RunFolder
from trainflow.config.shape import flops_per_token, mfu
from trainflow.config.sources import sources_of
from trainflow.config.startup import StartupPart
from trainflow.data.mixture import SourceShare, realised
from trainflow.data.sampler import TokenSampler
from trainflow.fp8 import backend_reason
from trainflow.parallel import Parallelized
from trainflow.parallel.mesh import build_mesh
from trainflow.resilience.arrivals import Arrivals
from trainflow.train.build import build_model
from trainflow.train.checkpointing import SegmentCheckpoints
from trainflow.train.clock import ForwardClock
from trainflow.train.controls import StopFlag, build_optimizer, set_determinism
from trainflow.train.faults import maybe_arrive, maybe_inject_fault, maybe_poison, maybe_slow
from trainflow.train.guard import LossGuard
from trainflow.train.peer_state import Boundary
from trainflow.train.profile import memory_mb
from trainflow.train.recorder import StepRecorder
from trainflow.train.snapshots import PeerSnapshots
from trainflow.train.step_log import StepRecord
from trainflow.train.summary import Fp8Use, ProfileSummary, SegmentSetup, SegmentSpeed, SegmentSummary

log = logging.getLogger(__name__)


@dataclass
class Trainer:
    cfg: TrainflowConfig
    device: torch.device
    on_phase: Callable[[str, int], None] = lambda kind, step: None
    """Told (kind, step) when the loop enters a step's data loading or compute, an evaluation, a save or a load:
    energy.node's window (DVFS acts on data and compute) and launch.heartbeat's progress."""
    on_step: Callable[[StepRecord], None] = lambda record: None
    """Told each step's record, on every rank (launch.heartbeat keeps each rank's compute time: stragglers)."""
    on_part: Callable[[StartupPart], None] = lambda part: None
    """Told as each part of the start-up the trainer runs ends (communicators, build, load): launch.task's marker
    records when, the parts of a job's start-up (config.startup)."""
    attempt: int = 0
    """Which job of the segment this is: fault drills strike in the first only (train.faults)."""
    snapshots: PeerSnapshots | None = None
    """Peer snapshots to take at step starts (checkpoint.snapshot_steps; kept by the rank across its generations)."""
    model: Parallelized = field(init=False)
    optimizers: list[torch.optim.Optimizer] = field(init=False)

    def __post_init__(self) -> None:
        cfg, t = self.cfg, self.cfg.train
        set_determinism(seed=t.seed, deterministic=t.deterministic, threads=t.threads_per_rank)
        self.dims = ParallelDims.from_config(
            cfg.parallel, cfg.model, world_size=dist.get_world_size(), global_batch=t.global_batch
        )
        self.mesh = build_mesh(self.dims, self.device.type)
        self.on_part(StartupPart.COMMUNICATORS)
        self.rank, self.is_logger = dist.get_rank(), dist.get_rank() == 0
        self.model, self.parameters, self.offloader = build_model(cfg, self.device, self.dims, self.mesh, self.rank)
        self.clock = ForwardClock(self.model.named_parts(), self.device)
        maybe_slow(cfg.fault, self.model.named_parts())
        self.optimizers = [build_optimizer(part, cfg.optim, self.device) for part in self.model.parts]
        dp_rank, rows = self.mesh["dp"].get_local_rank(), self.dims.local_batch(t.global_batch)
        self.rows = slice(dp_rank * rows, (dp_rank + 1) * rows)
        cp = self.dims.cp
        columns = cp_chunks(cfg.model.seq_len, cp, self.mesh["cp"].get_local_rank()) if cp > 1 else None
        self.sampler = TokenSampler(
            cfg.io.staged_tokens,
            seq_len=cfg.model.seq_len,
            seed=t.seed,
            cross_document=t.cross_document,
            weights={s.name: s.weight for s in sources_of(cfg.data)},
            columns=columns,
        )
        self.build_records()
        self.on_part(StartupPart.BUILD)

    def build_records(self) -> None:
        """Checkpoints and their interval, the stop signal, what the segment records of itself."""
        self.stop = StopFlag(self.device)
        self.arrivals = Arrivals.for_job(
            self.cfg.fault,
            ledger=Path(RunFolder.faults_log(self.cfg.io.checkpoints)),
            rank=self.rank,
            world=self.dims.world_size,
            attempt=self.attempt,
            segment=self.cfg.segment,
        )
        self.guard = LossGuard(self.cfg.train.spike)
        self.span = span = segment_span(self.cfg)
        self.start_step, self.end_step = span.start, span.end
        self.recorder = StepRecorder(self.cfg, rank=self.rank, device=self.device, span=span)
        self.ckpt = SegmentCheckpoints(
            self.cfg,
            self.device,
            self.model,
            self.optimizers,
            self.guard,
            self.recorder,
            on_phase=self.on_phase,
            attempt=self.attempt,
            is_logger=self.is_logger,
            span=span,
            weights=dict(zip(self.sampler.names, self.sampler.weights)),
        )

    # -- loop ----------------------------------------------------------------------------------

    def train_step(self, step: int) -> StepRecord:
        start, started = time.perf_counter(), time.time()
        self.on_phase("data", step)
        lr = self.ckpt.schedule.lr_at(step)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        stream, batch = self.ckpt.stream, self.cfg.train.global_batch
        rows = stream.take(batch)
        window = [rows.start, rows.end]
        inputs, targets = self.sampler.train(rows, self.rows, block=stream.block, ahead=stream.peek(batch))
        data_s = time.perf_counter() - start
        self.on_phase("compute", step)
        self.clock.reset()
        loss, times = self.model.forward_backward(inputs.to(self.device), targets.to(self.device))
        maybe_poison(self.cfg.fault, rows.start // batch, loss, self.model.parameters())
        grad_norm = self.model.clip_grad_norm(self.cfg.optim.grad_clip)
        skipped = self.guard.judge(step, window, float(loss), grad_norm)  # global loss and norm: every rank agrees
        self.model.end_step(applied=skipped is None)  # fp8's amax history leaves a step not applied out
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
            window=window,
            sources=np.bincount(rows.sources, minlength=len(self.sampler.names)).tolist(),
        )

    def evaluate(self, step: int) -> float:
        """Each source's validation loss (train.eval_batches batches of its own split) and their weighted mean."""
        started = time.time()
        per_source = {}
        for k, name in enumerate(self.sampler.names):
            losses = []
            for i in range(self.cfg.train.eval_batches):
                self.on_phase("eval", step)  # each batch is progress: a long evaluation is no hang (launch.heartbeat)
                inputs, targets = self.sampler.evaluation(i, self.cfg.train.global_batch, self.rows, source=k)
                losses.append(float(self.model.eval_loss(inputs.to(self.device), targets.to(self.device))))
            per_source[name] = sum(losses) / len(losses)
        weights = dict(zip(self.sampler.names, self.sampler.weights))
        val = sum(weights[n] * loss for n, loss in per_source.items()) / sum(weights.values())
        self.recorder.evaluation(step, val, started, time.time() - started, sources=per_source)
        return val

    def train(self, resumed: int | None = None) -> SegmentSummary:
        """Train to the segment's end, or until a stop signal; the segment's summary. `resumed`: the step a recovery
        from peers restored in memory (train.peer_state), instead of a checkpoint's."""
        t = self.cfg.train
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGUSR2, signal.SIGTERM)}
        step = self.ckpt.resume() if resumed is None else resumed
        self.on_part(StartupPart.LOAD)
        self.recorder.resume(step)
        if step == 0 and resumed is None:
            self.evaluate(0)
        if self.ckpt.opened:  # a phase's series opens with its start, in its own layout (config.phases)
            self.ckpt.save(step)
        since_save, stop_signal = 0, 0
        while step < self.end_step:
            self.mark_boundary(step)
            if self.snapshots is not None and self.snapshots.due(step):
                self.snapshots.take(self)
            maybe_inject_fault(self.cfg.fault, step, during_save=False, attempt=self.attempt)
            maybe_arrive(self.arrivals, step)
            record = self.train_step(step)
            step += 1
            since_save += 1
            self.recorder.step(record)
            self.on_step(record)
            self.ckpt.planner.observe_step(record.step_s)
            self.ckpt.poll()  # async: where the save in flight stands, agreed
            if record.skipped and self.guard.rollback_due:
                step, since_save = self.ckpt.rollback(), 0
                continue
            if record.skipped:
                self.recorder.guard(self.guard.skip_event())
            if step % t.eval_every == 0 or step == self.end_step:
                self.evaluate(step)
            if stop_signal := self.stop.agreed():
                self.ckpt.save(step)
                break
            if step == self.end_step or self.ckpt.planner.due(since_save):
                self.ckpt.save(step)
                since_save = 0
        # After the last step a pre-timeout USR2 stays with the stop flag, unread: submitit's handler would requeue a
        # finished segment (seen when the signal came while the last checkpoint was closing).
        for sig, handler in previous.items():
            if stop_signal or sig != signal.SIGUSR2:
                signal.signal(sig, handler)
        if self.snapshots is not None:
            self.snapshots.wait()  # the exchange in flight ends with the segment
        self.ckpt.finish()  # async: the save in flight is durable before the segment ends
        self.sampler.close()
        if self.offloader is not None:
            self.offloader.close()
        return self.summary(step, stop_signal, profile=self.recorder.close())

    def mark_boundary(self, step: int) -> None:
        """What step `step`'s start holds beside the tensors (train.peer_state.Boundary): a recovery from peers
        retries a step that failed part way from it, its rows drawn and its loss judged again."""
        c = self.ckpt
        self.boundary = Boundary(step, c.stream.position, c.schedule, self.guard.state(), c.init_from)

    def mfu(self, tokens_per_s_per_device: float) -> float:
        return mfu(self.cfg.model, tokens_per_s_per_device, peak_tflops=self.cfg.cluster.hardware.peak_tflops)

    def setup(self) -> SegmentSetup:
        t = self.cfg.train
        return SegmentSetup(
            layout=self.dims,
            parameters=self.parameters,
            precision=t.precision,
            activations=t.activations,
            compile=t.compiled(self.device.type),
            fp8=Fp8Use(t.fp8, self.model.fp8_backend, backend_reason(self.device) if t.fp8 != "none" else None),
            flops_per_token=flops_per_token(self.cfg.model),
            checkpoint_interval=self.ckpt.planner.describe(),
            init_from=self.ckpt.init_from,
        )

    def speed(self, steps: list[StepRecord]) -> SegmentSpeed:
        """From rank 0's step records, the first (warm-up) left out."""
        step_s = median(r.step_s for r in steps[1:] or steps) if steps else float("nan")
        tokens_per_device = self.cfg.train.global_batch * self.cfg.model.seq_len / step_s / self.dims.world_size
        return SegmentSpeed(step_s, tokens_per_device, self.mfu(tokens_per_device))

    def summary(self, step: int, stop_signal: int, *, profile: ProfileSummary | None) -> SegmentSummary:
        """The segment's record; its step records are rank 0's (the other ranks report none)."""
        steps = self.recorder.steps()
        return SegmentSummary(
            segment=self.cfg.segment,
            start_step=self.start_step,
            end_step=step,
            completed=step == self.end_step,
            interrupted_by=signal.Signals(stop_signal).name if stop_signal else None,
            restart_count=int(os.environ.get("SLURM_RESTART_COUNT", 0)),
            setup=self.setup(),
            speed=self.speed(steps),
            state_digest=state_digest(self.ckpt.state()),
            profile=profile,
            saves=self.ckpt.saves,
            steps=steps,
            evals=self.recorder.evals(),
            guard=self.recorder.guard_events(),
            ranks=self.recorder.rank_timings(),
            mixture=self.mixture(steps),
        )

    def mixture(self, steps: list[StepRecord]) -> list[SourceShare]:
        """The realised mixture of the segment's applied steps (rank 0's records): their rows by source."""
        rows = [r.sources for r in steps if r.skipped is None]
        return realised(self.sampler.names, self.sampler.weights, rows=rows, seq_len=self.cfg.model.seq_len)
