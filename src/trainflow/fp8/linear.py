"""Float8Linear: an nn.Linear whose three GEMMs run in fp8, with dynamic or delayed (amax-history) scaling.

    layer = Float8Linear(1024, 4096, bias=False, recipe="delayed", history_len=16)
    y = layer(x); y.sum().backward(); sync_amax_history([model], group=None)   # once per optimizer step

Design note (the recipe of Transformer Engine and torchao's tensorwise float8, without their machinery):
- forward    y  = x W^T      x, W in e4m3                  fp8_gemm(xq, Wq)
- backward   dx = dy W       dy in e5m2, W in e4m3         fp8_gemm(dyq, Wq^T)
             dW = dy^T x     dy in e5m2, x in e4m3         fp8_gemm(dyq^T, xq^T)
  Each tensor has one scale (per tensor). The quantised x and W are saved for backward (1 byte per value),
  transposed copies are made where a GEMM needs the other operand K-contiguous. Accumulation is fp32;
  y comes out in the autocast dtype (else x's dtype), dx in x's dtype, dW in the weight's (the fp32 master
  weight under autocast, bf16 under FSDP2's mixed precision, which gathers the weight before forward).
- dynamic: each scale comes from the tensor's own amax, computed just before the cast.
- delayed: each scale comes from the largest amax of the last `history_len` optimizer steps; the amaxes seen
  during a step (every microbatch and recomputation: a max, so repeats change nothing) collect in
  `amax_pending` and enter the history when `sync_amax_history` runs, all-reduced (MAX) over the data-parallel
  group in one collective, so every replica scales identically. Until a history holds a value (the first step)
  the current amax is used. The history is a persistent buffer, `amax_history` (3, history_len) with rows
  input / weight / grad_output, newest first: it is in the state_dict, so a resumed run scales as the
  uninterrupted one did. Values beyond a delayed scale's range saturate (cast.quantise).
Tolerances (tests/unit/test_fp8.py): outputs and gradients equal the fp32 computation on the fp8-rounded
tensors up to fp32 summation order; against full-precision fp32 they are within the e4m3/e5m2 rounding bound.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from trainflow.fp8.cast import E4M3, E5M2, amax, quantise, scale_from_amax
from trainflow.fp8.ops import fp8_gemm

RECIPES = ("dynamic", "delayed")
INPUT, WEIGHT, GRAD_OUTPUT = 0, 1, 2  # rows of amax_history / entries of amax_pending


def gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The output dtype fp8_gemm writes for a wanted `dtype`: bf16 directly, anything else via fp32."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def delayed_amax(past: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """The amax a delayed scale uses: the history's largest (`past`), or `current` while the history is empty."""
    return torch.where(past > 0, past, current)


class _Fp8Matmul(torch.autograd.Function):
    """y = x W^T with the three GEMMs in fp8 (see the module docstring); x (..., K), W (N, K)."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        x_scale: torch.Tensor,
        w_scale: torch.Tensor,
        grad_past: torch.Tensor | None,
        grad_pending: torch.Tensor | None,
        out_dtype: torch.dtype,
        margin: int,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        xq, wq = quantise(x2, x_scale, E4M3), quantise(weight, w_scale, E4M3)
        y = fp8_gemm(xq, wq, x_scale.reciprocal(), w_scale.reciprocal(), gemm_dtype(out_dtype))  # (M, N)
        ctx.save_for_backward(xq, wq, x_scale, w_scale, grad_past)
        # Not saved with save_for_backward: the buffer is updated in place by later microbatches (its version
        # counter would then refuse it), and this backward must add to it, not to a snapshot.
        ctx.grad_pending = grad_pending
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype, ctx.margin = x.shape, x.dtype, weight.dtype, margin
        return y.to(out_dtype).reshape(*x.shape[:-1], wq.shape[0])

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        xq, wq, x_scale, w_scale, grad_past = ctx.saved_tensors
        g = grad_y.reshape(-1, grad_y.shape[-1])  # (M, N)
        g_amax = amax(g)
        if ctx.grad_pending is not None:  # delayed: record this amax, scale from the history
            ctx.grad_pending.copy_(torch.maximum(ctx.grad_pending, g_amax))
            g_amax = delayed_amax(grad_past, g_amax)
        g_scale = scale_from_amax(g_amax, E5M2, ctx.margin)
        gq = quantise(g, g_scale, E5M2)
        g_inv = g_scale.reciprocal()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:  # (M, N) x (K, N)^T -> (M, K)
            grad_x = fp8_gemm(gq, wq.t().contiguous(), g_inv, w_scale.reciprocal(), gemm_dtype(ctx.x_dtype))
            grad_x = grad_x.to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:  # (N, M) x (K, M)^T -> (N, K)
            grad_w = fp8_gemm(gq.t().contiguous(), xq.t().contiguous(), g_inv, x_scale.reciprocal(), torch.float32)
            grad_w = grad_w.to(ctx.w_dtype)
        return grad_x, grad_w, None, None, None, None, None, None


class Float8Linear(nn.Linear):
    """nn.Linear with fp8 GEMMs; the same parameters (names, shapes, dtypes) as the nn.Linear it replaces."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        recipe: str = "dynamic",
        history_len: int = 16,
        margin: int = 0,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if recipe not in RECIPES:
            raise ValueError(f"Float8Linear: recipe {recipe!r} is not one of {', '.join(RECIPES)}")
        if recipe == "delayed" and history_len < 1:
            raise ValueError(f"Float8Linear: history_len={history_len} must be >= 1 for the delayed recipe")
        self.recipe, self.history_len, self.margin = recipe, history_len, margin
        if recipe == "delayed":
            self.register_amax_buffers(device)

    def register_amax_buffers(self, device: torch.device | str | None) -> None:
        """The delayed recipe's state: the history (checkpointed) and this step's amaxes (not: zero after a sync)."""
        self.register_buffer("amax_history", torch.zeros(3, self.history_len, device=device))
        self.register_buffer("amax_pending", torch.zeros(3, device=device), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, recipe: str, history_len: int, margin: int = 0) -> Float8Linear:
        """A Float8Linear that holds `linear`'s own Parameter objects (so optimizers and state_dicts see no change)."""
        with torch.device("meta"):
            new = cls(
                linear.in_features,
                linear.out_features,
                bias=linear.bias is not None,
                recipe=recipe,
                history_len=history_len,
                margin=margin,
            )
        new.weight = linear.weight
        new.bias = linear.bias
        if recipe == "delayed":
            new.register_amax_buffers(linear.weight.device)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        out_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        x_amax, w_amax = amax(x), amax(self.weight)
        grad_past = grad_pending = None
        if self.recipe == "delayed":
            self.amax_pending[:GRAD_OUTPUT].copy_(
                torch.maximum(self.amax_pending[:GRAD_OUTPUT], torch.stack((x_amax, w_amax)))
            )
            past = self.amax_history.amax(dim=1)  # (3,): input, weight, grad_output
            x_amax, w_amax = delayed_amax(past[INPUT], x_amax), delayed_amax(past[WEIGHT], w_amax)
            grad_past, grad_pending = past[GRAD_OUTPUT], self.amax_pending[GRAD_OUTPUT:]
        x_scale = scale_from_amax(x_amax, E4M3, self.margin)
        w_scale = scale_from_amax(w_amax, E4M3, self.margin)
        y = _Fp8Matmul.apply(x, self.weight, x_scale, w_scale, grad_past, grad_pending, out_dtype, self.margin)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        history = f", history_len={self.history_len}" if self.recipe == "delayed" else ""
        return f"{super().extra_repr()}, recipe={self.recipe}{history}"


def sync_amax_history(parts: list[nn.Module], group: dist.ProcessGroup | None) -> None:
    """Roll this step's amaxes into every delayed Float8Linear's history: all-reduced (MAX) over `group` in ONE
    collective (None: a single process, no collective). Call once per optimizer step on every rank of the group;
    the group is the ranks that hold the same layers (the data-parallel group)."""
    layers = [m for part in parts for m in part.modules() if isinstance(m, Float8Linear) and m.recipe == "delayed"]
    if not layers:
        return
    pending = torch.stack([m.amax_pending for m in layers])  # (layers, 3)
    if group is not None:
        dist.all_reduce(pending, op=dist.ReduceOp.MAX, group=group)
    for m, newest in zip(layers, pending):
        m.amax_history.copy_(torch.cat((newest[:, None], m.amax_history[:, :-1]), dim=1))
        m.amax_pending.zero_()
