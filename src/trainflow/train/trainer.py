"""The training loop of one segment, run by every rank: train / train_step, resume, checkpoint.

    python -m trainflow.stages.train_segment segment=0 parallel=dp2_tp2_pp2

A segment trains steps [segment * segment_steps, (segment + 1) * segment_steps), resuming from the
newest verified checkpoint at or before its end. The batch of a step is a pure function of
(seed, step), the learning rate a pure function of the step, and the model has no dropout: so
model, optimizer and step are all a resumed run needs to continue bit for bit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainflow.checkpoint.interval import IntervalPlanner
from trainflow.checkpoint.manager import CheckpointManager
from trainflow.checkpoint.state import build_state, load_state
from trainflow.config import TrainflowConfig, as_dict
from trainflow.config.layout import ParallelDims
from trainflow.config.run_folder import evals_log, steps_log
from trainflow.config.shape import flops_per_token
from trainflow.data.sampler import TokenSampler
from trainflow.errors import TrainflowError
from trainflow.model import Llama, cross_entropy
from trainflow.parallel import Parallelized, parallelize_model
from trainflow.progress import Progress
from trainflow.train.activations import apply_activations
from trainflow.train.compile import apply_compile
from trainflow.train.controls import StopFlag, build_optimizer, lr_at, set_determinism
from trainflow.train.profile import StepProfiler, memory_mb
from trainflow.train.step_log import StepLog
from trainflow.train.tensorboard import TensorBoardLog

log = logging.getLogger(__name__)


COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


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
        cfg = self.cfg
        t, m = cfg.train, cfg.model
        set_determinism(seed=t.seed, deterministic=t.deterministic, threads=t.threads_per_rank)
        self.dims = ParallelDims.from_config(
            cfg.parallel, m, world_size=dist.get_world_size(), global_batch=t.global_batch
        )
        self.mesh = self.dims.build_mesh(self.device.type)
        full = Llama(m)
        self.n_params = full.num_params()
        self.flops_per_token = flops_per_token(m)
        self.model = parallelize_model(
            full.to(self.device),
            self.dims,
            self.mesh,
            loss_fn=cross_entropy,
            device=self.device,
            bucket_mb=cfg.parallel.bucket_mb,
            overlap=cfg.parallel.overlap,
            activation_shape=(t.global_batch // (self.dims.dp * self.dims.microbatches), m.seq_len, m.dim),
            compute_dtype=COMPUTE_DTYPES[t.precision],
            fp8=t.fp8,
            fp8_amax_history=t.fp8_amax_history,
        )
        if self.model.fp8_backend is not None and dist.get_rank() == 0:
            log.info("FP8 GEMMs (recipe %s) run on %s", t.fp8, self.model.fp8_backend)
        offload = Path(t.offload_dir) / f"rank{dist.get_rank()}" if t.offload_dir else None
        self.offloader = apply_activations(self.model.named_parts(), t.activations, offload)
        if t.compile:
            apply_compile(self.model.named_parts(), self.device)
        self.optimizers = [build_optimizer(part, cfg.optim, self.device) for part in self.model.parts]
        self.dp_rank = self.mesh["dp"].get_local_rank()
        rows = t.global_batch // self.dims.dp
        self.rows = slice(self.dp_rank * rows, (self.dp_rank + 1) * rows)
        self.sampler = TokenSampler(
            cfg.io.staged_tokens, seq_len=m.seq_len, seed=t.seed, cross_document=t.cross_document
        )
        self.start_step = cfg.segment * t.segment_steps
        self.end_step = self.start_step + t.segment_steps
        ends = {(s + 1) * t.segment_steps for s in range(t.segments)}
        self.checkpoints = CheckpointManager(
            cfg.io.checkpoints, keep=cfg.checkpoint.keep, pinned=ends, io_threads=cfg.checkpoint.io_threads
        )
        self.planner = IntervalPlanner(
            mtbf_s=cfg.cluster.hardware.mtbf_hours * 3600,
            fixed_steps=cfg.checkpoint.interval_steps,
            max_steps=cfg.checkpoint.max_interval_steps,
        )
        self.stop = StopFlag()
        self.saves: list[dict] = []
        """This job's checkpoint saves (step, wall-clock start, seconds): the energy report's checkpoint phase."""
        self.is_logger = dist.get_rank() == 0
        self.steps_log = StepLog(steps_log(cfg.io.checkpoints))
        self.evals_log = StepLog(evals_log(cfg.io.checkpoints))
        train_dir, o = Path(cfg.io.segment_report).parent, cfg.observe
        self.tensorboard = TensorBoardLog(train_dir / "tensorboard" if self.is_logger and o.tensorboard else None)
        self.profiler = StepProfiler(
            train_dir / "profile" / f"segment-{cfg.segment}" if o.profile else None,
            rank=dist.get_rank(),
            steps=o.profile_steps,
            device=self.device,
        )

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
        state = self.state(step)
        seconds = self.checkpoints.save(
            step,
            state,
            before_commit=lambda: self.maybe_inject_fault(step, during_save=True),
            layout=self.cfg.parallel.name,
            model=as_dict(self.cfg.model),  # what trainflow.export rebuilds the model from
        )
        self.saves.append({"step": step, "started": time.time() - seconds, "save_s": seconds})
        before = self.planner.interval_steps
        self.planner.observe_save(seconds)
        plan = self.planner.describe()
        if self.is_logger and plan["interval_steps"] != before:
            log.info(
                "Planned a checkpoint every %d steps (%s: save %.2f s, step %.3f s, MTBF %.1f h%s)",
                plan["interval_steps"],
                plan["policy"],
                plan["save_s"],
                plan["step_s"],
                plan["mtbf_s"] / 3600,
                f" -> sqrt(2 x save x MTBF) = {plan['interval_s']:.0f} s" if plan["interval_s"] else "",
            )

    def maybe_inject_fault(self, step: int, *, during_save: bool) -> None:
        """The configured drill (cfg.fault): a signal at a step start, or death inside a checkpoint write."""
        f = self.cfg.fault
        if step != f.step or dist.get_rank() != f.rank or during_save != f.during_save:
            return
        log.warning(
            "Injected fault at step %d on rank %d: %s",
            step,
            f.rank,
            "death during save" if during_save else f"SIG{f.signal}",
        )
        if during_save:
            os._exit(3)
        os.kill(os.getpid(), getattr(signal, f"SIG{f.signal}"))

    # -- loop ----------------------------------------------------------------------------------

    def train_step(self, step: int) -> dict:
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
        return {
            "step": step,
            "started": started,
            "loss": float(loss),
            "lr": lr,
            "grad_norm": grad_norm,
            "step_s": seconds,
            "tokens_per_s": tokens / seconds,
            "mfu": self.mfu(tokens / seconds / self.dims.world_size),
            "memory_mb": memory_mb(self.device),
            "data_s": data_s,
            "compute_s": times.compute,
            "dp_comm_s": times.dp_comm,
            "bubble_s": times.bubble,
            "activation_s": times.activation,
        }

    def evaluate(self, step: int) -> float:
        losses = []
        for i in range(self.cfg.train.eval_batches):
            inputs, targets = self.sampler.batch("val", i, self.cfg.train.global_batch, self.rows)
            losses.append(float(self.model.eval_loss(inputs.to(self.device), targets.to(self.device))))
        val = sum(losses) / len(losses)
        if self.is_logger:
            self.evals_log.append({"step": step, "val_loss": val})
            self.tensorboard.evaluation(step, val)
            log.info("Evaluated step %d: validation loss %.4f", step, val)
        return val

    def train(self) -> dict:
        """Train to the segment's end, or until a stop signal; the segment's summary."""
        t = self.cfg.train
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGUSR2, signal.SIGTERM)}
        step = self.resume()
        if self.is_logger:
            self.steps_log.drop(step, self.end_step - 1)  # steps record the step they started from
            self.evals_log.drop(step + 1 if step else 0, self.end_step)  # evals the step they ended at
        if step == 0:
            self.evaluate(0)
        progress = Progress(log, "Trained", self.end_step - self.start_step, unit="steps", every_s=10.0)
        since_save, interrupted = 0, 0
        while step < self.end_step:
            self.maybe_inject_fault(step, during_save=False)
            record = self.train_step(step)
            step += 1
            since_save += 1
            self.profiler.step()
            if self.is_logger:
                self.steps_log.append(record)
                self.tensorboard.step(record)
            self.planner.observe_step(record["step_s"])
            if self.is_logger and (step % t.log_every == 0 or step == self.end_step):
                log.info(
                    "step %d loss %.4f lr %.2e grad_norm %.3f %.0f tokens/s",
                    step,
                    record["loss"],
                    record["lr"],
                    record["grad_norm"],
                    record["tokens_per_s"],
                )
                progress.update(step - self.start_step)
            if step % t.eval_every == 0 or step == self.end_step:
                self.evaluate(step)
            if interrupted := self.stop.agreed():
                self.save(step)
                break
            if step == self.end_step or self.planner.due(since_save):
                self.save(step)
                since_save = 0
        # After the last step a pre-timeout USR2 stays with the stop flag, unread: submitit's handler would requeue a
        # finished segment (seen when the signal came while the last checkpoint was closing).
        for sig, handler in previous.items():
            if interrupted or sig != signal.SIGUSR2:
                signal.signal(sig, handler)
        self.sampler.close()
        self.checkpoints.close()
        if self.offloader is not None:
            self.offloader.close()
        self.tensorboard.close()
        return self.summary(step, interrupted, profile=self.profiler.close())

    def mfu(self, tokens_per_s_per_device: float) -> float:
        """Model FLOPs utilisation: the model's FLOPs per second per device over the device's dense peak."""
        return tokens_per_s_per_device * self.flops_per_token / (self.cfg.cluster.hardware.peak_tflops * 1e12)

    def state_digest(self) -> list[str]:
        """SHA-256 of every rank's local model and optimizer tensors, gathered: equal lists = bitwise equal runs."""
        h = hashlib.sha256()
        for section in ("model", "optim"):
            for key, value in sorted(self.state()[section].items()):
                if isinstance(value, torch.Tensor):
                    local = value.to_local() if isinstance(value, DTensor) else value
                    h.update(key.encode())
                    h.update(local.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        digests: list[str] = [""] * dist.get_world_size()
        dist.all_gather_object(digests, h.hexdigest())
        return digests

    def summary(self, step: int, interrupted: int, *, profile: dict | None) -> dict:
        tokens = self.cfg.train.global_batch * self.cfg.model.seq_len
        steps = self.steps_log.between(self.start_step, self.end_step - 1) if self.is_logger else []
        steady = sorted(r["step_s"] for r in steps[1:] or steps) or [float("nan")]
        step_s = steady[len(steady) // 2]
        tokens_per_device = tokens / step_s / self.dims.world_size
        return {
            "segment": self.cfg.segment,
            "start_step": self.start_step,
            "end_step": step,
            "completed": step == self.end_step,
            "interrupted_by": signal.Signals(interrupted).name if interrupted else None,
            "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
            "world_size": self.dims.world_size,
            "layout": {
                "dp": self.dims.dp,
                "tp": self.dims.tp,
                "pp": self.dims.pp,
                "v": self.dims.virtual_stages,
                "schedule": self.dims.schedule,
                "microbatches": self.dims.microbatches,
                "dp_mode": self.dims.dp_mode,
                "dp_shard": self.dims.shard_size,
            },
            "n_params": self.n_params,
            "precision": self.cfg.train.precision,
            "activations": self.cfg.train.activations,
            "compile": self.cfg.train.compile,
            "fp8": {"recipe": self.cfg.train.fp8, "backend": self.model.fp8_backend},
            "flops_per_token": self.flops_per_token,
            "median_step_s": step_s,
            "tokens_per_s_per_device": tokens_per_device,
            "mfu": self.mfu(tokens_per_device),
            "checkpoint_interval": self.planner.describe(),
            "state_digest": self.state_digest(),
            "profile": profile,
            "saves": self.saves,
            "steps": steps,
            "evals": self.evals_log.between(self.start_step, self.end_step) if self.is_logger else [],
        }
