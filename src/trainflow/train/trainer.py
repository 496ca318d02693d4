"""The training loop of one segment, run by every rank: train / train_step, resume, checkpoint.

    python -m trainflow.stages.train_segment segment=0 parallel=dp2_tp2_pp2

A segment trains steps [segment * segment_steps, (segment + 1) * segment_steps), resuming from the
newest verified checkpoint at or before its end. The batch of a step is a pure function of
(seed, step), the learning rate a pure function of the step, and the model has no dropout: so
model, optimizer and step are all a resumed run needs to continue bit for bit.
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

from trainflow.checkpoint.interval import IntervalPlanner, SaveDone
from trainflow.checkpoint.manager import CheckpointManager
from trainflow.checkpoint.state import build_state, load_state, state_bytes, state_digest
from trainflow.config import ParallelDims, TrainflowConfig, as_dict
from trainflow.config.run_folder import RunFolder
from trainflow.config.schema import PRECISIONS
from trainflow.config.shape import flops_per_token, mfu
from trainflow.data.sampler import TokenSampler
from trainflow.errors import TrainflowError
from trainflow.fp8 import backend_reason
from trainflow.model import Llama, cross_entropy
from trainflow.parallel import Parallelized, parallelize_model
from trainflow.train.activations import apply_activations
from trainflow.train.compile import apply_compile
from trainflow.train.controls import StopFlag, build_optimizer, lr_at, set_determinism
from trainflow.train.faults import maybe_inject_fault
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
    on_phase: Callable[[str], None] = lambda kind: None
    """Told when a step enters its data loading and its compute (energy.node's window: DVFS acts on it)."""
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
        self.build_model()
        self.optimizers = [build_optimizer(part, cfg.optim, self.device) for part in self.model.parts]
        dp_rank, rows = self.mesh["dp"].get_local_rank(), self.dims.local_batch(t.global_batch)
        self.rows = slice(dp_rank * rows, (dp_rank + 1) * rows)
        self.sampler = TokenSampler(
            cfg.io.staged_tokens, seq_len=cfg.model.seq_len, seed=t.seed, cross_document=t.cross_document
        )
        self.start_step = cfg.segment * t.segment_steps
        self.end_step = self.start_step + t.segment_steps
        self.build_records()

    def build_model(self) -> None:
        """The model of this rank, parallelized, with its activation memory mode and compiled blocks."""
        cfg, t, m = self.cfg, self.cfg.train, self.cfg.model
        full = Llama(m)
        self.parameters = full.num_params()
        self.model = parallelize_model(
            full.to(self.device),
            self.dims,
            self.mesh,
            loss_fn=cross_entropy,
            device=self.device,
            bucket_mb=cfg.parallel.bucket_mb,
            overlap=cfg.parallel.overlap,
            activation_shape=(self.dims.microbatch_size(t.global_batch), m.seq_len, m.dim),
            compute_dtype=getattr(torch, PRECISIONS[t.precision].dtype),
            fp8=t.fp8,
            fp8_amax_history=t.fp8_amax_history,
        )
        if self.model.fp8_backend is not None and self.is_logger:
            log.info("FP8 GEMMs (recipe %s) run on %s", t.fp8, self.model.fp8_backend)
        offload = Path(RunFolder.offload(t.offload_dir, self.rank)) if t.offload_dir else None
        self.offloader = apply_activations(self.model.named_parts(), t.activations, offload)
        if t.compile:
            apply_compile(self.model.named_parts(), self.device)

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
        self.recorder = StepRecorder(cfg, rank=self.rank, device=self.device)

    # -- state ---------------------------------------------------------------------------------

    def state(self, step: int = 0) -> dict:
        return build_state(self.model.named_parts(), self.optimizers, step=step)

    def resume(self) -> int:
        """Load the newest verified checkpoint at or before the segment's end (this run's, else
        io.resume_from's, resharded to this layout); its step."""
        source, step = self.checkpoints, self.checkpoints.newest_valid(at_most=self.end_step)
        if step < 0 and self.cfg.io.resume_from:
            source = CheckpointManager(
                self.cfg.io.resume_from, keep=0, pinned=set(), io_threads=self.cfg.checkpoint.io_threads
            )
            step = source.newest_valid(at_most=self.end_step)
        if step < 0:
            if self.start_step > 0:
                raise ResumeError(
                    f"segment {self.cfg.segment} starts at step {self.start_step} but {self.cfg.io.checkpoints} "
                    f"holds no valid checkpoint at or before step {self.end_step}; rerun segment "
                    f"{self.cfg.segment - 1} or set io.resume_from=<another run's checkpoint folder>"
                )
            return 0
        state = self.state()
        source.load(step, state)
        loaded = load_state(self.model.named_parts(), self.optimizers, state)
        if self.is_logger:
            log.info("Resumed from the checkpoint of step %d in %s", loaded, source.root)
        return loaded

    def save(self, step: int) -> None:
        done = self.checkpoints.save(
            step,
            self.state(step),
            optimizers=self.optimizers,  # async: their next step waits for the background copy of their tensors
            step_s=self.planner.step_s,
            before_commit=lambda: maybe_inject_fault(self.cfg.fault, step, during_save=True),
            layout=self.cfg.parallel.name,
            model=as_dict(self.cfg.model),  # what trainflow.export rebuilds the model from
        )
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
        self.on_phase("data")
        lr = lr_at(step, self.cfg.optim, self.cfg.train.total_steps)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        inputs, targets = self.sampler.batch("train", step, self.cfg.train.global_batch, self.rows)
        data_s = time.perf_counter() - start
        self.on_phase("compute")
        loss, times = self.model.forward_backward(inputs.to(self.device), targets.to(self.device))
        grad_norm = self.model.clip_grad_norm(self.cfg.optim.grad_clip)
        for opt in self.optimizers:
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
        )

    def evaluate(self, step: int) -> float:
        losses = []
        for i in range(self.cfg.train.eval_batches):
            inputs, targets = self.sampler.batch("val", i, self.cfg.train.global_batch, self.rows)
            losses.append(float(self.model.eval_loss(inputs.to(self.device), targets.to(self.device))))
        val = sum(losses) / len(losses)
        self.recorder.evaluation(step, val)
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
            maybe_inject_fault(self.cfg.fault, step, during_save=False)
            record = self.train_step(step)
            step += 1
            since_save += 1
            self.recorder.step(record)
            self.planner.observe_step(record.step_s)
            self.saved(self.checkpoints.poll())  # async: where the save in flight stands, agreed
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
        )
