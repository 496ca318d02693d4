"""What steers a training step besides the model: the optimizer, determinism, and the stop all ranks agree on (the
learning rate is the schedule's a checkpoint carries: config.schedule).

    python -c "from trainflow.config import compose; from trainflow.train.controls import build_optimizer"
"""

from __future__ import annotations

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


def set_determinism(*, seed: int, deterministic: bool, threads: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@dataclass
class StopFlag:
    """Set by Slurm's pre-timeout / preemption signal on any rank; agreed on at step boundaries."""

    device: torch.device
    """Where the agreement's tensor lives: the rank's device (an NCCL group reduces no CPU tensor)."""
    signum: int = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.signum = signum

    def agreed(self) -> int:
        """The signal any rank received (0: none), the same answer on every rank."""
        flag = torch.tensor(self.signum, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag)
