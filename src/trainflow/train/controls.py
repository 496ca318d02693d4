"""What steers a training step besides the model: the optimizer, the learning-rate schedule,
determinism, and the stop all ranks agree on.

    python -c "from trainflow.config import compose; from trainflow.train.controls import lr_at; \
        print(lr_at(100, compose('train_segment').optim, total_steps=300))"
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainflow.config import OptimConfig


def build_optimizer(model: torch.nn.Module, optim: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW on torch's multi-tensor path (fused kernels on CUDA), one param group per kind of tensor.

    foreach and fused kernels take lists of one kind: plain tensors, or DTensors of one mesh and placement
    (TP shards, FSDP shards, both). Each group gets the same lr and decay.
    """
    groups: dict[object, list[torch.nn.Parameter]] = {}
    for p in model.parameters():
        kind = (p.device_mesh, tuple(p.placements)) if isinstance(p, DTensor) else None
        groups.setdefault(kind, []).append(p)
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        [{"params": ps} for ps in groups.values()],
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        weight_decay=optim.weight_decay,
        foreach=not fused,
        fused=fused,
    )


def lr_at(step: int, optim: OptimConfig, total_steps: int) -> float:
    """Linear warmup, then cosine decay to lr * min_lr_ratio at the last step."""
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    progress = (step - optim.warmup_steps) / max(total_steps - optim.warmup_steps, 1)
    return optim.lr * (
        optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    )


def set_determinism(*, seed: int, deterministic: bool, threads: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@dataclass
class StopFlag:
    """Set by Slurm's pre-timeout / preemption signal on any rank; agreed on at step boundaries."""

    signum: int = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.signum = signum

    def agreed(self) -> int:
        """The signal any rank received (0: none), the same answer on every rank."""
        flag = torch.tensor(self.signum)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag)
