"""The rowwise FP8 recipe (train.fp8=rowwise): one scale per row of A and per column of B^T in every GEMM, taken
from the current amaxes, as torchao's rowwise float8 recipe scales (its recommendation for large runs: one outlier
token or output feature no longer flattens the scale of the whole tensor).

    y = rowwise_matmul(x, weight, out_dtype=torch.bfloat16, margin=0, fwd_group=None, bwd_group=None)

Design note. fp8_gemm(a, b, scale_a, scale_b) = diag(scale_a) (a b^T) diag(scale_b) already takes one scale per row
of a and of b (the Hopper kernel's epilogue broadcasts both vectors; the reference and _scaled_mm's path apply them
to the fp32 sums), so a scale per row of each operand along K is all a recipe needs:
- forward    y  = x W^T     x (M, K) e4m3, a scale per token;           W (N, K) e4m3, a scale per output feature
- backward   dx = dy W      dy (M, N) e5m2, a scale per token;          W^T (K, N) e4m3, a scale per input feature
             dW = dy^T x    dy^T (N, M) e5m2, a scale per out feature;  x^T (K, M) e4m3, a scale per input feature
  Each backward operand is scaled along the other axis than forward's, so backward quantises again from the
  high-precision x and W (saved for it: 2 bytes a value under bf16, where the per-tensor recipes save 1), as
  torchao's rowwise recipe does; requantising an fp8 tensor would round twice.
Tensor parallel: a scale is the amax over K of the whole row, so where tp shards the reduced dimension the amaxes
are MAX all-reduced over tp (one vector each): forward under RowwiseParallel (x and W sharded along K), backward
under ColwiseParallel (dy and W sharded along N); every other reduction runs over a dimension each rank holds
whole. So each shard is quantised as one process quantises the whole tensor, as the per-tensor recipes are.
Tolerances: those of the per-tensor recipes (tests/unit/test_fp8.py, tests/distributed/test_numerics.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from trainflow.fp8.cast import E4M3, E5M2, quantise, scale_from_amax
from trainflow.fp8.ops import fp8_gemm, gemm_dtype


def quantise_rows(
    t: torch.Tensor, dtype: torch.dtype, margin: int, group: dist.ProcessGroup | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """t (R, K) in `dtype`, each row scaled from its own amax over K (MAX all-reduced over `group`, where K is
    sharded), contiguous; and the (R,) dequantisation multipliers fp8_gemm takes."""
    row_amax = t.detach().abs().amax(dim=1).float()  # (R,)
    if group is not None:
        dist.all_reduce(row_amax, op=dist.ReduceOp.MAX, group=group)
    scale = scale_from_amax(row_amax, dtype, margin)
    return quantise(t, scale[:, None], dtype).contiguous(), scale.reciprocal()


class _RowwiseMatmul(torch.autograd.Function):
    """y = x W^T with per-row scales in all three GEMMs (module docstring); x (..., K), W (N, K), local tensors."""

    @staticmethod
    def forward(ctx, x, weight, out_dtype, margin, fwd_group, bwd_group):
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        xq, x_inv = quantise_rows(x2, E4M3, margin, fwd_group)
        wq, w_inv = quantise_rows(weight, E4M3, margin, fwd_group)
        y = fp8_gemm(xq, wq, x_inv, w_inv, gemm_dtype(out_dtype))  # (M, N)
        ctx.save_for_backward(x2, weight)
        ctx.margin, ctx.bwd_group, ctx.x_shape, ctx.x_dtype = margin, bwd_group, x.shape, x.dtype
        return y.to(out_dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_y):
        x2, weight = ctx.saved_tensors
        g = grad_y.reshape(-1, grad_y.shape[-1])  # (M, N)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:  # (M, N) x (K, N)^T -> (M, K): both scaled along N
            gq, g_inv = quantise_rows(g, E5M2, ctx.margin, ctx.bwd_group)
            wtq, wt_inv = quantise_rows(weight.t(), E4M3, ctx.margin, ctx.bwd_group)
            grad_x = fp8_gemm(gq, wtq, g_inv, wt_inv, gemm_dtype(ctx.x_dtype)).to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:  # (N, M) x (K, M)^T -> (N, K): both scaled along M, which no rank shards
            gtq, gt_inv = quantise_rows(g.t(), E5M2, ctx.margin, None)
            xtq, xt_inv = quantise_rows(x2.t(), E4M3, ctx.margin, None)
            grad_w = fp8_gemm(gtq, xtq, gt_inv, xt_inv, torch.float32).to(weight.dtype)
        return grad_x, grad_w, None, None, None, None


def rowwise_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    out_dtype: torch.dtype,
    margin: int,
    fwd_group: dist.ProcessGroup | None,
    bwd_group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """x W^T in fp8 with per-row scales; fwd_group / bwd_group: the tp group where forward's / backward's amaxes
    run over a sharded dimension (RowwiseParallel / ColwiseParallel), else None."""
    return _RowwiseMatmul.apply(x, weight, out_dtype, margin, fwd_group, bwd_group)
