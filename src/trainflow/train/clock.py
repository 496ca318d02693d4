"""Each rank's own forward time per step: the straggler measure.

    clock = ForwardClock(model.named_parts(), device)
    clock.reset(); loss = ...forward and backward...; seconds = clock.take()   # Trainer.train_step

A slow rank hides in every rank's step and compute times: the others wait for its gradients inside their backward
(torch's DDP waits for the last bucket there) and at each collective. Its forward, under data parallelism, is its
own: the model's chunks are timed from their forward pre-hook (run first) to their forward hook, summed over the
step's microbatches; on a GPU with CUDA events (a host clock would time the kernel launches). Under tensor
parallelism a forward holds the tp all-reduces, so a slow rank slows its tp group's forwards alike: the ranks
compared are then the groups.
"""

from __future__ import annotations

import time

import torch
from torch import nn


class ForwardClock:
    def __init__(self, parts: list[nn.Module], device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.open: list[object] = []
        self.spans: list[tuple[object, object]] = []
        for part in parts:
            part.register_forward_pre_hook(self.begin, prepend=True)  # before any other pre-hook (fault.slow_ms's)
            part.register_forward_hook(self.end)

    def mark(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin(self, module: nn.Module, args: object) -> None:
        self.open.append(self.mark())

    def end(self, module: nn.Module, args: object, output: object) -> None:
        if self.open:
            self.spans.append((self.open.pop(), self.mark()))

    def reset(self) -> None:
        self.open, self.spans = [], []

    def take(self) -> float:
        """Seconds of forward since the last reset (after the step's work is done: on a GPU it waits for it)."""
        if self.cuda and self.spans:
            self.spans[-1][1].synchronize()
            total = sum(a.elapsed_time(b) for a, b in self.spans) / 1e3  # milliseconds
        else:
            total = sum((b - a for a, b in self.spans), 0.0)
        self.reset()
        return total
