"""Data parallel: replicated (torch's DDP on a pure-dp mesh, else trainflow's bucketed GradReducer) or
sharded (torch's FSDP2, `fully_shard`; HSDP on a 2-D dp mesh).

parts, reducer = apply_dp(parts, dims, mesh["dp"], bucket_mb=25, overlap=True)
apply_fsdp(parts, mesh["dp"], compute_dtype=torch.bfloat16, pipelined=False)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from trainflow.config.layout import ParallelDims
from trainflow.parallel.grad_reducer import GradReducer


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, *, bucket_mb: float) -> nn.Module:
    """torch's DDP: bucketed all-reduce overlapped with backward. Only on a 1-D (pure dp) mesh.

    Gradients are views into DDP's buckets, so no second fp32 copy of them exists (as in GradReducer). Buffers
    are not broadcast before each forward: the rotary tables are computed alike on every rank, and fp8's amax
    histories are agreed by their own all-reduce after backward.
    """
    return DistributedDataParallel(
        model,
        process_group=dp_mesh.get_group(),
        bucket_cap_mb=bucket_mb,
        gradient_as_bucket_view=True,
        broadcast_buffers=False,
    )


def apply_dp(
    parts: list[nn.Module], dims: ParallelDims, dp_mesh: DeviceMesh, *, bucket_mb: float, overlap: bool
) -> tuple[list[nn.Module], GradReducer | None]:
    """The model chunks to train and the reducer that `Parallelized` must finish after backward (None under DDP).

    DDP always overlaps, refuses DTensor (tp) parameters and would all-reduce after every
    microbatch's backward under a pipeline, so it serves only a pure-dp mesh with overlap on; every
    other layout gets a GradReducer over all the chunks.
    """
    if dims.tp == 1 and not dims.pp_enabled and overlap:
        (model,) = parts  # no pipeline: the one chunk is the whole model
        return [apply_ddp(model, dp_mesh, bucket_mb=bucket_mb)], None
    # Under a pipeline schedule backward runs once per microbatch: all-reduce after the last one.
    params = [p for part in parts for p in part.parameters()]
    return parts, GradReducer(params, dp_mesh.get_group(), bucket_mb=bucket_mb, overlap=overlap and not dims.pp_enabled)


def apply_fsdp(parts: list[nn.Module], dp_mesh: DeviceMesh, *, compute_dtype: torch.dtype, pipelined: bool) -> None:
    """FSDP2 over the dp mesh, torchtitan's way: each block a unit, then the chunk's root (embedding, norm, head).
    A 2-D mesh (dp_replicate, dp_shard) makes it HSDP: shards within a group, replicas across groups, where
    gradients are reduce-scattered in the group and then all-reduced across the replicas.

    Parameters are gathered in `compute_dtype` and gradients reduce-scattered in fp32, so bf16 here is
    FSDP's mixed precision, not autocast (Parallelized runs these chunks without it). Blocks are resharded
    after forward (ZeRO-3) except under a pipeline, whose schedule runs several microbatches' forwards
    before their backwards and would gather every block again for each one. torch's PipelineStage
    tells FSDP which backward is a step's last, where the reduce-scatter happens.
    """
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for part in parts:
        for block in part.layers.values():
            fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=not pipelined)
        fully_shard(part, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=not pipelined)
