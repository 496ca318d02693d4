"""The model one rank trains: the single-device Llama, parallelized to the layout, with its activation memory mode
and compiled blocks (the order torchtitan applies them in).

    model, parameters, offloader = build_model(cfg, device, dims, mesh, rank)   # Trainer does
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh

from trainflow.config import ParallelDims, TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.config.schema import PRECISIONS
from trainflow.model import Llama, cross_entropy
from trainflow.parallel import Parallelized, parallelize_model
from trainflow.train.activations import OffloadToFolder, apply_activations
from trainflow.train.compile import apply_compile

log = logging.getLogger(__name__)


def build_model(
    cfg: TrainflowConfig, device: torch.device, dims: ParallelDims, mesh: DeviceMesh, rank: int
) -> tuple[Parallelized, int, OffloadToFolder | None]:
    """This rank's parallelized model, the whole model's parameter count, and the activation offloader (None unless
    train.activations offloads)."""
    t, m = cfg.train, cfg.model
    full = Llama(m)
    parameters = full.num_params()
    model = parallelize_model(
        full.to(device),
        dims,
        mesh,
        loss_fn=cross_entropy,
        device=device,
        bucket_mb=cfg.parallel.bucket_mb,
        overlap=cfg.parallel.overlap,
        activation_shape=(dims.microbatch_size(t.global_batch), m.seq_len // dims.cp, m.dim),
        compute_dtype=getattr(torch, PRECISIONS[t.precision].dtype),
        fp8=t.fp8,
        fp8_amax_history=t.fp8_amax_history,
        kernel_cache=cfg.io.kernel_cache,
    )
    if model.fp8_backend is not None and rank == 0:
        log.info("FP8 GEMMs (recipe %s) run on %s", t.fp8, model.fp8_backend)
    offload = Path(RunFolder.offload(t.offload_dir, rank)) if t.offload_dir else None
    offloader = apply_activations(model.named_parts(), t.activations, offload)
    if t.compiled(device.type):
        apply_compile(model.named_parts(), device)
    return model, parameters, offloader
