"""The parallelized model at run time: parallelize_model applies the layout, Parallelized runs the steps.

par = parallelize_model(model, dims, mesh, loss_fn=..., device=..., bucket_mb=..., overlap=...)
loss, times = par.forward_backward(inputs, targets); norm = par.clip_grad_norm(1.0)
par.end_step(applied=True)   # after the loss guard's verdict: fp8's amax history

Mixed precision (train.precision=bf16) is torch's autocast around forward and loss, pipeline schedules
included: matmuls and attention run in bf16, while the parameters (the master weights), their gradients,
the gradient all-reduce and AdamW's state stay fp32, as do the residual stream between blocks and
pipeline stages, the norms and the loss. That is torchtitan's choice outside FSDP and Megatron's
(bf16 compute, fp32 main params and grads reduced in fp32); it needs no loss scaling, keeps
checkpoints in fp32 (so any run resumes in either precision), and costs autocast's bf16 weight copies,
held for one forward.
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
from torch.nn.parallel import DistributedDataParallel

from trainflow.config.layout import ParallelDims
from trainflow.fp8 import apply_fp8, discard_amax, sync_amax_history
from trainflow.parallel.context import apply_cp
from trainflow.parallel.data_parallel import apply_dp, apply_fsdp
from trainflow.parallel.grad_reducer import GradReducer
from trainflow.parallel.mesh import batch_mesh, fsdp_mesh
from trainflow.parallel.pipeline import TiedEmbedding, build_schedule, pipeline_model, tie_embeddings
from trainflow.parallel.tensor_parallel import apply_tp
from trainflow.parallel.timing import PipelineClock, StepTimes, add_compute_timers, probe_exchange_seconds
from trainflow.tensors import local
from trainflow.torch_compat import rearm_recv_grads


@dataclass
class Parallelized:
    parts: list[nn.Module]
    """The model chunks this rank owns (two or more under interleaved 1F1B)."""
    dims: ParallelDims
    mesh: DeviceMesh
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    schedule: object | None = None
    """torch's pipeline schedule over this rank's stages; None without a pipeline."""
    reducer: GradReducer | None = None
    has_first: bool = True
    has_last: bool = True
    clock: PipelineClock = field(default_factory=PipelineClock)
    """The pipeline stages' compute time and probed exchange cost; unused without a pipeline."""
    autocast: torch.dtype | None = None
    """bf16: forward under autocast (parameters, gradients and their reduction stay fp32); None: none."""
    fp8_backend: str | None = None
    """Where the blocks' fp8 GEMMs run (trainflow.fp8.load_backend: reference, kernel, scaled_mm); None: no fp8."""
    tied: TiedEmbedding | None = None
    """A tied embedding / head split over the pipeline, whose copies' gradients each step sums; None: none here."""

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]

    def named_parts(self) -> list[nn.Module]:
        """The chunks without DDP's wrapper, whose state_dict keys match the single-device model."""
        return [p.module if isinstance(p, DistributedDataParallel) else p for p in self.parts]

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, StepTimes]:
        """One step's gradients, synchronised across dp; the loss (mean over this dp rank's rows)."""
        start = time.perf_counter()
        self.clock.compute_s = 0.0
        if self.reducer is not None:
            self.reducer.zero_grad()  # .grad back into the buckets (the optimizer's set_to_none dropped them), zeroed
        loss = self.local_loss(inputs, targets, backward=True)
        mid = time.perf_counter()
        if self.reducer is not None:
            self.reducer.finish()
        if self.tied is not None:
            self.tied.sum_grads()
        dp_comm = time.perf_counter() - mid
        # Without a pipeline the whole forward/backward is compute; within one, only the timed stage calls are.
        times = StepTimes(compute=mid - start) if self.schedule is None else self.clock.step_times(mid - start)
        times.dp_comm = dp_comm
        return self.global_loss(loss.detach()), times

    def end_step(self, *, applied: bool) -> None:
        """After the loss guard's verdict on the step (agreed on every rank): delayed fp8 scaling rolls the step's
        amaxes into the history, MAX all-reduced over dp x cp, then over tp, or, for a step not applied, drops them."""
        if self.fp8_backend is None:
            return
        if not applied:
            discard_amax(self.named_parts())
            return
        replicas = batch_mesh(self.dims, self.mesh)
        groups = [m.get_group() for m in (replicas, self.mesh["tp"]) if m.size() > 1]
        sync_amax_history(self.named_parts(), *groups)

    @torch.no_grad()
    def eval_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.global_loss(self.local_loss(inputs, targets, backward=False))

    def local_loss(self, inputs: torch.Tensor, targets: torch.Tensor, *, backward: bool) -> torch.Tensor:
        """This rank's loss of the batch, with backward run if asked: one forward, or the pipeline schedule.

        Under a pipeline only the first stage takes the inputs and only the last the targets and
        computes a loss; the other ranks return zero, which global_loss's sum over pp relies on.
        """
        device_type = inputs.device.type
        with torch.autocast(device_type, dtype=self.autocast, enabled=self.autocast is not None):
            if self.schedule is None:
                loss = self.loss_fn(self.parts[0](inputs), targets)
            else:
                losses: list[torch.Tensor] = []
                # contiguous: torch 2.11's first stage checks its inputs' strides against a contiguous meta copy
                # (the sampler's [:, :-1] view has stride T+1; 2.12+ check only under TORCH_DISTRIBUTED_DEBUG=DETAIL)
                args = (inputs.contiguous(),) if self.has_first else ()
                run = self.schedule.step if backward else self.schedule.eval
                run(*args, target=targets if self.has_last else None, losses=losses)
                if not backward:
                    rearm_recv_grads(self.schedule)
                loss = torch.stack(losses).mean() if self.has_last else torch.zeros(())
        if backward and self.schedule is None:
            loss.backward()  # outside autocast, as torch's AMP recipe says: backward ops take their forward's dtype
        return loss

    def global_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss of the whole global batch on every rank: from the last stage, averaged over dp (x cp: each cp rank's
        loss is the mean over as many positions of the same rows)."""
        if self.dims.world_size == 1:
            return loss
        loss = loss.clone().float()
        if self.dims.pp_enabled:
            dist.all_reduce(loss, group=self.mesh["pp"].get_group())  # only the last stage is non-zero
        replicas = batch_mesh(self.dims, self.mesh)
        if replicas.size() > 1:
            dist.all_reduce(loss, group=replicas.get_group())
            loss /= replicas.size()
        return loss

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip by the global gradient norm over every shard and stage; returns the norm before clipping.

        Hand-written: torch's clip_grad_norm_ cannot mix gradients of different meshes (FSDP's dp x tp, TP's
        tp, plain replicated ones) in one call, nor sum over pipeline stages. Each gradient's squared local
        norm is summed over the mesh dimensions it is sharded on (Shard placements) and counted once over
        those it is replicated on; every stage's share is then summed over pp, a tied head's copy not counted again.
        """
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        copy = self.tied.head if self.tied is not None else None
        device = grads[0].device if grads else None  # where the gradients are: the norms stay on the GPU
        by_sharding: dict[tuple[str, ...], torch.Tensor] = {}
        for g in (g for g in grads if copy is None or g is not copy.grad):
            dims = sharded_dims(g)
            square = torch.linalg.vector_norm(local(g), dtype=torch.float64) ** 2
            by_sharding[dims] = by_sharding.get(dims, torch.zeros((), dtype=torch.float64, device=device)) + square
        total = torch.zeros((), dtype=torch.float64, device=device)
        for dims, square in by_sharding.items():
            for name in dims:
                dist.all_reduce(square, group=self.mesh[name].get_group())
            total += square
        if self.dims.pp_enabled:
            dist.all_reduce(total, group=self.mesh["pp"].get_group())
        norm = float(total.sqrt())
        if max_norm > 0 and norm > max_norm:
            scale = max_norm / (norm + 1e-6)
            for g in grads:
                g.mul_(scale)
        return norm


def sharded_dims(t: torch.Tensor) -> tuple[str, ...]:
    """The mesh dimensions a DTensor is sharded over (by name); () for a plain tensor. FSDP over TP's
    column-parallel shards places a _StridedShard, which is_shard() does not count: so not replicated."""
    if not isinstance(t, DTensor):
        return ()
    return tuple(n for n, p in zip(t.device_mesh.mesh_dim_names, t.placements) if not p.is_replicate())


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
    compute_dtype: torch.dtype = torch.float32,
    fp8: str = "none",
    fp8_amax_history: int = 16,
    kernel_cache: str = "",
) -> Parallelized:
    """Apply the layout in torchtitan's fixed order: pipeline split, fp8 linears, tensor and context parallel per chunk,
    data parallel (which holds the modules it is given, so the fp8 swap comes before it). Tensor parallel shards a
    Float8Linear as it shards an nn.Linear (trainflow.fp8.linear's note says how its GEMMs run on the shards).

    activation_shape is one microbatch's activation, the message whose exchange time is probed (pp > 1 only);
    kernel_cache the fp8 kernels' build cache (io.kernel_cache, trainflow.fp8.cache).
    """
    autocast = compute_dtype if compute_dtype != torch.float32 else None
    tied = model.output is not None and model.output.weight is model.tok_embeddings.weight
    result = Parallelized(parts=[model], dims=dims, mesh=mesh, loss_fn=loss_fn, autocast=autocast)
    if dims.pp_enabled:
        exchange_s = probe_exchange_seconds(mesh["pp"], activation_shape, device=device)
        result.clock = PipelineClock(exchange_s=exchange_s, exchanges=2 * dims.virtual_stages * dims.microbatches)
        stages, result.parts = pipeline_model(model, dims=dims, pp_mesh=mesh["pp"], device=device)
        result.has_first = any(s.is_first for s in stages)
        result.has_last = any(s.is_last for s in stages)
        add_compute_timers(stages, result.clock)
    if fp8 != "none":
        backends = {
            apply_fp8(part, recipe=fp8, history_len=fp8_amax_history, kernel_cache=kernel_cache)
            for part in result.parts
        }
        (result.fp8_backend,) = backends  # one device per rank, so one backend
    if dims.tp > 1:
        for part in result.parts:
            apply_tp(part, mesh["tp"])
    if dims.cp > 1:
        apply_cp(result.parts, mesh["cp"])
    if dims.fsdp_enabled:
        apply_fsdp(result.parts, fsdp_mesh(dims, mesh), compute_dtype=compute_dtype, pipelined=dims.pp_enabled)
        result.autocast = None  # FSDP gathers the parameters in the compute dtype
    elif dims.dp * dims.cp > 1:
        replicas = batch_mesh(dims, mesh)
        result.parts, result.reducer = apply_dp(result.parts, dims, replicas, bucket_mb=bucket_mb, overlap=overlap)
    if dims.pp_enabled:
        result.schedule = build_schedule(stages, dims=dims, loss_fn=loss_fn)
        if tied:
            result.tied = tie_embeddings(result.named_parts(), mesh)
    return result
