"""Context parallel: every sequence split over the cp ranks, keys and values all-gathered per layer.

    apply_cp(parts, mesh["cp"])   # parallelize_model does, after tensor parallel

Llama 3's recipe (the all-gather flavour of Megatron's and torchtitan's context parallel): a sequence of T tokens is
cut into 2 x cp equal chunks and cp rank i holds chunks i and 2cp-1-i (config.layout.cp_chunks; the sampler hands
each rank those columns), so under the causal mask every rank has the same work. Each attention gathers the K and V
of the whole sequence from the cp group (one collective of K and V stacked; with grouped-query attention they are
n_kv_heads / n_heads of Q's size, which is why this is cheap) and attends its T / cp queries against all T keys
under a mask by global positions: query p sees key s where p >= s. That is exactly one process's causal mask, so
the result is one process's up to the order of the softmax's sums (the golden-loss tests hold it to 1e-5).
`train.cross_document=false` windows lie inside one document (data.sampler), so there is no document boundary
inside a window and the causal mask is the whole of the mask there too.

The gather is torch's functional collective (`all_gather_single_autograd`; 2.11 has only the older
`all_gather_tensor_autograd`), whose backward is the reduce-scatter (sum) of the gathered K and V's gradients, so
each rank's K and V receive what every rank's queries sent back: no hand-written autograd Function. Rotary
positions follow each chunk's place: the rotary tables keep the rows of the rank's positions, in its order
(Llama.forward takes the first T rows of them). Gradients are then averaged over dp x cp (the "dp_cp" mesh:
parallel.mesh.batch_mesh), the loss too: every cp rank holds the same weights and T / cp of every sequence.

Shortcut admitted: the mask is dense, (T / cp, T) booleans per rank, and the attention runs over all T keys though
the first chunk needs only the keys before it; a flash kernel with per-chunk bounds would skip that work.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainflow.config.layout import cp_chunks

gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
"""torch >= 2.13's name, else the older one (the same op: an all-gather whose backward reduce-scatters)."""


def gathered_mask(seq_len: int, cp: int, rank: int, device: torch.device) -> torch.Tensor:
    """(T / cp, T) booleans, True where rank `rank`'s query may attend a gathered key: by global positions, the
    keys in the all-gather's order (rank by rank, each rank's two chunks in its own order)."""
    queries = torch.tensor(cp_chunks(seq_len, cp, rank), device=device)
    keys = torch.tensor([p for r in range(cp) for p in cp_chunks(seq_len, cp, r)], device=device)
    return queries[:, None] >= keys[None, :]


class GatheredAttention:
    """An attention core (model.Attention.core) over the keys and values of the whole sequence, gathered from the
    cp group; the queries are this rank's positions. `inner` is the model's core (model.attention), which takes the
    mask (parallel/ does not import the model: same layer) and then groups the query heads in SDPA (enable_gqa), so
    the gathered K and V are saved at their own head count. The mask is passed additive (0 / -inf) in the dtype
    attention runs in, made once per dtype and shared by every layer: SDPA turns a boolean mask into such a tensor at
    each call and its backward keeps that copy, one per layer (measured, benchmarks/cp_memory.py: with those copies
    and K and V repeated to the query heads, cp2's peak was 0.69 x cp1's; without, 0.505, at seq 1024)."""

    def __init__(self, inner: Callable[..., torch.Tensor], group: dist.ProcessGroup, allowed: torch.Tensor) -> None:
        self.inner, self.group, self.allowed = inner, group, allowed
        self.masks: dict[torch.dtype, torch.Tensor] = {}

    def mask(self, q: torch.Tensor) -> torch.Tensor:
        """The additive mask in the dtype SDPA computes in (autocast's where it is on, which would cast it)."""
        kind = q.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else q.dtype
        if dtype not in self.masks:
            zeros = torch.zeros(self.allowed.shape, dtype=dtype, device=q.device)
            self.masks[dtype] = zeros.masked_fill(~self.allowed, float("-inf"))
        return self.masks[dtype]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kv = gather(torch.stack((k, v)).contiguous(), gather_dim=3, group=self.group)  # (2, B, kv_heads, T, hd)
        return self.inner(q, kv[0], kv[1], mask=self.mask(q))  # (B, heads, T / cp, hd)


def apply_cp(parts: list[nn.Module], cp_mesh: DeviceMesh) -> None:
    """Each chunk's attentions gather K and V over the cp mesh; its rotary tables (model.seq_len rows) keep the
    rank's positions."""
    for part in parts:
        seq_len = part.rope_cos.shape[0]
        positions = cp_chunks(seq_len, cp_mesh.size(), cp_mesh.get_local_rank())
        index = torch.tensor(positions, device=part.rope_cos.device)
        part.rope_cos, part.rope_sin = part.rope_cos[index], part.rope_sin[index]  # (T / cp, hd), buffers still
        mask = gathered_mask(seq_len, cp_mesh.size(), cp_mesh.get_local_rank(), part.rope_cos.device)
        for module in part.modules():
            if hasattr(module, "core"):  # model.Attention
                module.core = GatheredAttention(module.core, cp_mesh.get_group(), mask)
