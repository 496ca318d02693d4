"""Data parallel: torch's DDP on a pure-dp mesh, else trainflow's bucketed GradReducer.

parts, reducer = apply_dp(parts, dims, mesh["dp"], bucket_mb=25, overlap=True)
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from trainflow.config.layout import ParallelDims
from trainflow.parallel.grad_reducer import GradReducer


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, *, bucket_mb: float) -> nn.Module:
    """torch's DDP: bucketed all-reduce overlapped with backward. Only on a 1-D (pure dp) mesh."""
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), bucket_cap_mb=bucket_mb)


def apply_dp(
    parts: list[nn.Module], dims: ParallelDims, dp_mesh: DeviceMesh, *, bucket_mb: float, overlap: bool
) -> tuple[list[nn.Module], GradReducer | None]:
    """The model chunks to train and the reducer that `Parallelized` must finish after backward (None under DDP).

    DDP always overlaps, refuses DTensor (tp) parameters and would all-reduce after every
    microbatch's backward under a pipeline, so it serves only a pure-dp mesh with overlap on; every
    other layout gets a GradReducer over all the chunks.
    """
    if dims.tp == 1 and dims.pp == 1 and overlap:
        (model,) = parts  # no pipeline: the one chunk is the whole model
        return [apply_ddp(model, dp_mesh, bucket_mb=bucket_mb)], None
    # Under a pipeline schedule backward runs once per microbatch: all-reduce after the last one.
    params = [p for part in parts for p in part.parameters()]
    return parts, GradReducer(params, dp_mesh.get_group(), bucket_mb=bucket_mb, overlap=overlap and dims.pp == 1)
