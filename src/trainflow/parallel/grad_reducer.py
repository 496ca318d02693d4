"""Bucketed gradient all-reduce over the data-parallel group, optionally overlapped with backward.

reducer = GradReducer(params, dp_group, bucket_mb=25, overlap=True)
reducer.zero_grad(); loss.backward(); reducer.finish()  # every .grad is now the dp average

Hand-written because torch's DDP refuses DTensor (tensor-parallel) parameters. torch 2.13's composable
`replicate` (the private torch.distributed._composable.replicate_with_fsdp, FSDP2 on a replicate-only
mesh) accepts them, but turns every parameter into a dp x tp DTensor, which changes the checkpoint and
optimizer layout, and reduces per wrapped module rather than per bucket_mb.

The layout is DDP's `gradient_as_bucket_view`: each bucket is one flat buffer, allocated once, and every
parameter's `.grad` is a view into it (for a DTensor parameter, a DTensor whose local tensor is the view).
`zero_grad()` zeroes the buffers and points each `.grad` back at its view, since the optimizer's
`zero_grad(set_to_none=True)` drops them; backward then accumulates into the views in place, microbatch
after microbatch under a pipeline, so a bucket is all-reduced where it lies and nothing is copied in or
out. Buckets take parameters in reverse registration order, the order backward produces their gradients;
with `overlap`, a post-accumulate-grad hook counts each bucket's gradients and all-reduces it
asynchronously once all have arrived (in bucket order, so every rank issues the same collectives in the
same order), and `finish()` only waits. Without it (pipelines, whose backward runs once per microbatch)
`finish()` launches every bucket. The average is each buffer divided by the dp size, then summed (gloo
has no ReduceOp.AVG). `bucket_mb=0` all-reduces every parameter alone (the baseline of
benchmarks/grad_buckets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from trainflow.tensors import local


@dataclass
class Bucket:
    params: list[nn.Parameter]
    flat: torch.Tensor
    """The gradients of `params`, end to end: what the all-reduce sends and receives."""
    grads: list[torch.Tensor]
    """Each parameter's `.grad`: a view into `flat` (wrapped as a DTensor of the parameter's spec if it is one)."""
    ready: int = 0
    """Gradients accumulated in this backward (overlap only)."""
    work: dist.Work | None = field(default=None, repr=False)


class GradReducer:
    def __init__(
        self, params: list[nn.Parameter], group: dist.ProcessGroup, *, bucket_mb: float, overlap: bool
    ) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        limit = bucket_mb * 2**20
        groups: list[list[nn.Parameter]] = []
        size, kind = 0.0, None
        for p in reversed([p for p in params if p.requires_grad]):  # backward produces the last layers' first
            nbytes = local(p).numel() * local(p).element_size()
            if not groups or size + nbytes > limit or (local(p).dtype, local(p).device) != kind:
                groups.append([])  # a flat buffer holds one dtype on one device
                size, kind = 0.0, (local(p).dtype, local(p).device)
            groups[-1].append(p)
            size += nbytes
        self.buckets = [bucket_of_views(g) for g in groups]
        self.bucket_of = {p: b for b in self.buckets for p in b.params}
        self.next = 0  # the first bucket not launched yet: buckets launch in order
        if overlap:
            for p in self.bucket_of:
                p.register_post_accumulate_grad_hook(self._on_grad)

    @torch.no_grad()
    def zero_grad(self) -> None:
        """Zero the buckets and make every parameter's `.grad` its view again; call before each step's backward."""
        for b in self.buckets:
            b.flat.zero_()
            for p, g in zip(b.params, b.grads):
                if p.grad is not g:
                    p.grad = g

    def _on_grad(self, p: nn.Parameter) -> None:
        self.bucket_of[p].ready += 1
        while self.next < len(self.buckets) and self.buckets[self.next].ready == len(self.buckets[self.next].params):
            self._launch(self.buckets[self.next])
            self.next += 1

    def _launch(self, b: Bucket) -> None:
        for p, g in zip(b.params, b.grads):
            if p.grad is None or local(p.grad).data_ptr() != local(g).data_ptr():
                raise RuntimeError(
                    f"A gradient of shape {tuple(p.shape)} is not in its GradReducer bucket: call "
                    "GradReducer.zero_grad() before each step's backward, not the optimizer's set_to_none alone"
                )
        b.flat.div_(self.world)
        b.work = dist.all_reduce(b.flat, group=self.group, async_op=True)

    def finish(self) -> None:
        """Launch the buckets backward did not and wait for all: every `.grad` then holds the dp average."""
        for b in self.buckets[self.next :]:
            self._launch(b)
        for b in self.buckets:
            b.work.wait()
            b.work, b.ready = None, 0
        self.next = 0


def bucket_of_views(params: list[nn.Parameter]) -> Bucket:
    """One zeroed flat buffer for `params`' gradients and each parameter's `.grad` as a view into it."""
    first = local(params[0])
    flat = torch.zeros(sum(local(p).numel() for p in params), dtype=first.dtype, device=first.device)
    grads, offset = [], 0
    for p in params:
        n = local(p).numel()
        view = flat[offset : offset + n].view(local(p).shape)
        if isinstance(p, DTensor):
            view = DTensor.from_local(
                view, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
            )
        grads.append(view)
        offset += n
    return Bucket(params, flat, grads)
