"""The device mesh of a validated layout (config.layout.ParallelDims): one named mesh, outermost first, the part of
it FSDP2 shards over, and the ranks that share the weights and split the batch.

    mesh = build_mesh(dims, "cuda")          # dims = ParallelDims.from_config(...)
    apply_fsdp(parts, fsdp_mesh(dims, mesh), ...)
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainflow.config.layout import ParallelDims


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """pp (slowest links), dp, cp, tp (inside a node's NVLink).

    Under HSDP dp is split into dp_replicate (outer) x dp_shard (inner), and "dp" names the two flattened:
    data-parallel rank r * dp_shard + s is the same process as under plain dp, so batches do not move. With
    context parallel "dp_cp" names dp x cp flattened (every rank of it holds the same weights: gradients and the
    loss are averaged over it) and, under HSDP, "dp_shard_cp" the shard group's dp_shard x cp (torchtitan's names).
    """
    names = ("dp_replicate", "dp_shard") if dims.hsdp else ("dp",)
    shape = (dims.dp // dims.shard_size, dims.shard_size) if dims.hsdp else (dims.dp,)
    if dims.cp > 1:
        names, shape = (*names, "cp"), (*shape, dims.cp)
    mesh = init_device_mesh(device_type, (dims.pp, *shape, dims.tp), mesh_dim_names=("pp", *names, "tp"))
    # _flatten is private but torchtitan's way to name a product of dims
    if dims.hsdp:
        mesh["dp_replicate", "dp_shard"]._flatten("dp")
    if dims.cp > 1:
        mesh[(*names[:-1], "cp")]._flatten("dp_cp")
    if dims.cp > 1 and dims.hsdp:
        mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    return mesh


def batch_mesh(dims: ParallelDims, mesh: DeviceMesh) -> DeviceMesh:
    """The ranks that hold the same weights and split the batch: dp, or dp x cp ("dp_cp") with context parallel."""
    return mesh["dp_cp"] if dims.cp > 1 else mesh["dp"]


def fsdp_mesh(dims: ParallelDims, mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards over: 1-D dp (dp x cp with context parallel), or 2-D (dp_replicate, dp_shard
    [x cp]), which fully_shard takes as HSDP."""
    if dims.hsdp:
        return mesh["dp_replicate", "dp_shard_cp" if dims.cp > 1 else "dp_shard"]
    return batch_mesh(dims, mesh)
