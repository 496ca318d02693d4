"""Hybrid parallelism applied to the single-device GPT, torchtitan style.

    parallelize_model(model, dims, mesh, ...) -> Parallelized

Fixed order: pipeline split (`pipeline_model`) -> tensor parallel on each chunk (`apply_tp`) ->
data parallel (`apply_ddp` on a 1-D mesh, else `GradReducer`). Everything is PyTorch's own API
(DeviceMesh, DTensor parallel styles, torch.distributed.pipelining, DDP) except the bucketed
gradient all-reduce for 2-D/3-D meshes, which DDP cannot do (see grad_reducer.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

from trainflow.parallel.dims import ParallelDims
from trainflow.parallel.grad_reducer import GradReducer
from trainflow.parallel.pipeline import build_schedule, pipeline_model

# Megatron's layout: the first linear of each pair column-parallel, the second row-parallel, so a
# block needs one all-reduce in attention and one in the MLP, forward and backward.
TP_PLAN = {
    "attention.wq": ColwiseParallel(),
    "attention.wk": ColwiseParallel(),
    "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(),
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(),
}


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard every block's attention and MLP over the tp mesh; embeddings, norms and head stay replicated."""
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, TP_PLAN)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, *, bucket_mb: float) -> nn.Module:
    """torch's DDP: bucketed all-reduce overlapped with backward. Only on a 1-D (pure dp) mesh."""
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), bucket_cap_mb=bucket_mb)


@dataclass
class StepTimes:
    """Seconds of one step, split as the seed's profile is: compute, exposed DP comm, bubble, activations."""

    compute: float = 0.0
    dp_comm: float = 0.0
    bubble: float = 0.0
    """Time in the pipeline schedule neither computing nor moving activations: idle wait."""
    activation: float = 0.0
    """Activation/gradient send/recv between stages: 2 x v x m exchanges at the probed time each."""


@dataclass
class Parallelized:
    parts: list[nn.Module]
    """The model chunks this rank owns (two or more under interleaved 1F1B)."""
    dims: ParallelDims
    mesh: DeviceMesh
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    schedule: object | None = None
    reducer: GradReducer | None = None
    has_first: bool = True
    has_last: bool = True
    compute_s: list[float] = field(default_factory=lambda: [0.0])
    exchange_s: float = 0.0
    """Measured seconds of one activation exchange with the pipeline neighbours (probe at build time)."""

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]

    def named_parts(self) -> list[nn.Module]:
        """The chunks without DDP's wrapper, whose state_dict keys match the single-device model."""
        return [p.module if isinstance(p, DistributedDataParallel) else p for p in self.parts]

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, StepTimes]:
        """One step's gradients, synchronised across dp; the loss (mean over this dp rank's rows)."""
        times, start = StepTimes(), time.perf_counter()
        self.compute_s[0] = 0.0
        if self.schedule is None:
            loss = self.loss_fn(self.parts[0](inputs), targets)
            loss.backward()
        else:
            losses: list[torch.Tensor] = []
            args = (inputs,) if self.has_first else ()
            self.schedule.step(*args, target=targets if self.has_last else None, losses=losses)
            loss = torch.stack(losses).mean() if self.has_last else torch.zeros(())
        mid = time.perf_counter()
        if self.reducer is not None:
            self.reducer.finish()
        times.dp_comm = time.perf_counter() - mid
        if self.schedule is None:
            times.compute = mid - start
        else:
            # Hooks time the compute; torch's schedules hide their p2p waits, so the rest of the
            # schedule's time is split with the probed cost of the exchanges a step makes.
            times.compute = self.compute_s[0]
            waiting = max(mid - start - times.compute, 0.0)
            times.activation = min(2 * self.dims.virtual_stages * self.dims.microbatches * self.exchange_s, waiting)
            times.bubble = waiting - times.activation
        return self.global_loss(loss.detach()), times

    @torch.no_grad()
    def eval_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.schedule is None:
            loss = self.loss_fn(self.parts[0](inputs), targets)
        else:
            losses: list[torch.Tensor] = []
            args = (inputs,) if self.has_first else ()
            self.schedule.eval(*args, target=targets if self.has_last else None, losses=losses)
            loss = torch.stack(losses).mean() if self.has_last else torch.zeros(())
        return self.global_loss(loss)

    def global_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss of the whole global batch on every rank: from the last stage, averaged over dp."""
        if self.dims.world_size == 1:
            return loss
        loss = loss.clone().float()
        if self.dims.pp > 1:
            dist.all_reduce(loss, group=self.mesh["pp"].get_group())  # only the last stage is non-zero
        if self.dims.dp > 1:
            dist.all_reduce(loss, group=self.mesh["dp"].get_group())
            loss /= self.dims.dp
        return loss

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip by the global gradient norm over every shard and stage; returns the norm before clipping.

        Hand-written: torch's clip_grad_norm_ cannot mix DTensor (TP) and plain (replicated) gradients
        in one call, nor sum over pipeline stages. Replicated gradients count once, sharded ones are
        summed over tp, and every stage's share is summed over pp.
        """
        sharded, replicated = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
        for p in self.parameters():
            if p.grad is None:
                continue
            if isinstance(p.grad, DTensor):
                sharded += torch.linalg.vector_norm(p.grad.to_local(), dtype=torch.float64) ** 2
            else:
                replicated += torch.linalg.vector_norm(p.grad, dtype=torch.float64) ** 2
        if self.dims.tp > 1:
            dist.all_reduce(sharded, group=self.mesh["tp"].get_group())
        total = sharded + replicated
        if self.dims.pp > 1:
            dist.all_reduce(total, group=self.mesh["pp"].get_group())
        norm = float(total.sqrt())
        if max_norm > 0 and norm > max_norm:
            scale = max_norm / (norm + 1e-6)
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        return norm


def parallelize_model(
    model: nn.Module,
    dims: ParallelDims,
    mesh: DeviceMesh,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    bucket_mb: float,
    overlap: bool,
    activation_shape: tuple[int, ...] = (),
) -> Parallelized:
    result = Parallelized(parts=[model], dims=dims, mesh=mesh, loss_fn=loss_fn)
    if dims.pp > 1:
        result.exchange_s = probe_exchange_seconds(mesh["pp"], activation_shape, device=device)
        stages, result.parts = pipeline_model(model, dims=dims, pp_mesh=mesh["pp"], device=device)
        result.has_first = any(s.is_first for s in stages)
        result.has_last = any(s.is_last for s in stages)
        add_compute_timers(stages, result.compute_s)
    if dims.tp > 1:
        for part in result.parts:
            apply_tp(part, mesh["tp"])
    if dims.dp > 1:
        if dims.tp == 1 and dims.pp == 1 and overlap:
            result.parts = [apply_ddp(model, mesh["dp"], bucket_mb=bucket_mb)]
        else:
            # Under a pipeline schedule backward runs once per microbatch: all-reduce after the last one.
            result.reducer = GradReducer(
                result.parameters(), mesh["dp"].get_group(), bucket_mb=bucket_mb, overlap=overlap and dims.pp == 1
            )
    if dims.pp > 1:
        result.schedule = build_schedule(stages, dims=dims, loss_fn=loss_fn)
    return result


def probe_exchange_seconds(pp_mesh: DeviceMesh, shape: tuple[int, ...], *, device: torch.device, iters: int = 5) -> float:
    """Median seconds to send one activation to the next stage while receiving one from the previous."""
    group = pp_mesh.get_group()
    rank, size = pp_mesh.get_local_rank(), pp_mesh.size()
    send, recv = torch.zeros(shape, device=device), torch.empty(shape, device=device)
    peers = [dist.get_global_rank(group, (rank + d) % size) for d in (1, -1)]
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        ops = [dist.P2POp(dist.isend, send, peers[0], group), dist.P2POp(dist.irecv, recv, peers[1], group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def add_compute_timers(stages: list, total: list[float]) -> None:
    """Accumulate the forward and backward compute of this rank's pipeline stages into total[0].

    Wraps PipelineStage.forward_one_chunk / backward_one_chunk, which every schedule calls and
    which do no communication; module backward hooks would miss the first stage, whose inputs
    (token ids) need no gradient."""

    def timed(method):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                total[0] += time.perf_counter() - start

        return wrapper

    for info in stages:
        info.stage.forward_one_chunk = timed(info.stage.forward_one_chunk)
        info.stage.backward_one_chunk = timed(info.stage.backward_one_chunk)
