"""The device mesh of a validated layout (config.layout.ParallelDims): one named mesh, outermost first, and the part
of it FSDP2 shards over.

    mesh = build_mesh(dims, "cuda")          # dims = ParallelDims.from_config(...)
    apply_fsdp(parts, fsdp_mesh(dims, mesh), ...)
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainflow.config.layout import ParallelDims


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """pp (slowest links), dp, tp (inside a node's NVLink).

    Under HSDP dp is split into dp_replicate (outer) x dp_shard (inner), and "dp" names the two flattened:
    data-parallel rank r * dp_shard + s is the same process as under plain dp, so batches do not move.
    """
    if not dims.hsdp:
        return init_device_mesh(device_type, (dims.pp, dims.dp, dims.tp), mesh_dim_names=("pp", "dp", "tp"))
    shape = (dims.pp, dims.dp // dims.shard_size, dims.shard_size, dims.tp)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
    mesh["dp_replicate", "dp_shard"]._flatten("dp")  # private but torchtitan's way to name the product
    return mesh


def fsdp_mesh(dims: ParallelDims, mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards over: 1-D dp, or 2-D (dp_replicate, dp_shard), which fully_shard takes as HSDP."""
    return mesh["dp_replicate", "dp_shard"] if dims.hsdp else mesh["dp"]
