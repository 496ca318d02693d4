"""torch.compile per transformer block (regional compilation, as torchtitan does).

    apply_compile(parts, device)

Each block is compiled in place (`nn.Module.compile`), so parameter names, checkpoints and the
tensor-parallel plan are unchanged; identical blocks share one compiled graph, so compile time does
not grow with depth. Applied after tensor parallel (DTensor blocks compile) and inside the
activation policy's `run_block` (recompute and offload wrap the compiled block).
"""

from __future__ import annotations

import torch
from torch import nn

from trainflow.errors import ConfigError
from trainflow.preflight import missing_compiler


def apply_compile(parts: list[nn.Module], device: torch.device) -> None:
    if device.type == "cpu" and (why := missing_compiler()):
        raise ConfigError(f"train.compile=true {why}")
    for part in parts:
        for block in part.layers.values():
            block.compile()
