"""Bucketed gradient all-reduce over the data-parallel group, optionally overlapped with backward.

Hand-written because torch's DDP refuses DTensor (tensor-parallel) parameters and composable
`replicate` hides them (measured, notes/stack.md); FSDP2 would shard the optimizer too, which is a
different trade. This is what the seed describes: gradients packed into buckets of `bucket_mb`,
each bucket all-reduced asynchronously as soon as its last gradient is ready (in reverse
registration order, the order backward produces them), and waited for only at the end.
`bucket_mb=0` all-reduces every parameter alone (the baseline of benchmarks/grad_buckets).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's data (a DTensor's local shard, else the tensor itself)."""
    return t._local_tensor if isinstance(t, DTensor) else t


class GradReducer:
    def __init__(
        self, params: list[nn.Parameter], group: dist.ProcessGroup, *, bucket_mb: float, overlap: bool
    ) -> None:
        self.group, self.overlap = group, overlap
        self.world = dist.get_world_size(group)
        params = [p for p in params if p.requires_grad]
        limit = bucket_mb * 2**20
        self.buckets: list[list[nn.Parameter]] = []
        size = limit  # forces a first bucket
        for p in reversed(params):  # backward produces the last layers' gradients first
            nbytes = local(p).numel() * local(p).element_size()
            if size + nbytes > limit or not self.buckets:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.pending: list[int] = [0] * len(self.buckets)
        self.works: list[tuple[dist.Work, torch.Tensor, int]] = []
        if overlap:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, p: nn.Parameter) -> None:
        i = self.bucket_of[id(p)]
        self.pending[i] += 1
        if self.pending[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i: int) -> None:
        grads = [local(p.grad) for p in self.buckets[i]]
        flat = torch.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1)
        flat.div_(self.world)
        self.works.append((dist.all_reduce(flat, group=self.group, async_op=True), flat, i))

    def finish(self) -> None:
        """Launch whatever backward did not, wait for every bucket and copy the averages back."""
        launched = {i for _, _, i in self.works}
        for i in range(len(self.buckets)):
            if i not in launched:
                self._launch(i)
        for work, flat, i in self.works:
            work.wait()
            offset = 0
            for p in self.buckets[i]:
                g = local(p.grad)
                if flat.data_ptr() != g.data_ptr():
                    g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        self.works.clear()
        self.pending = [0] * len(self.buckets)
