"""train.fp8=rowwise on CPU (trainflow.fp8.rowwise): each GEMM equals the fp32 product of its per-row dequantised
operands up to summation order, an outlier row no longer costs the other rows their precision, and the recipe traces
under torch.compile. At tp2: tests/unit/test_fp8_ranks.py; training: tests/distributed/test_numerics.py.

    .venv/bin/python -m pytest tests/unit/test_fp8_rowwise.py -q
"""

from __future__ import annotations

import copy

import torch

from tests.support import grads
from trainflow.fp8 import Float8Linear
from trainflow.fp8.cast import E4M3, E5M2, dequantise, quantise, scale_from_amax


def per_row(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t (R, K) quantised and dequantised with a scale per row from its amax over K: what the recipe multiplies."""
    scale = scale_from_amax(t.abs().amax(dim=1).float(), dtype)[:, None]
    return dequantise(quantise(t, scale, dtype), scale)


def test_each_gemm_is_the_product_of_per_row_dequantised_operands():
    torch.manual_seed(21)
    layer = Float8Linear(96, 80, bias=False, recipe="rowwise")
    x, dy = torch.randn(3, 7, 96), torch.randn(3, 7, 80) * 1e-3
    y, gx, gw = grads(layer, x, dy)
    x2, g, w = x.reshape(-1, 96), dy.reshape(-1, 80), layer.weight.detach()
    want_y = per_row(x2, E4M3) @ per_row(w, E4M3).t()  # per token, per output feature (over K)
    want_gx = per_row(g, E5M2) @ per_row(w.t(), E4M3).t()  # per token, per input feature (over N)
    want_gw = per_row(g.t(), E5M2) @ per_row(x2.t(), E4M3).t()  # per output feature, per input feature (over M)
    for got, want in ((y.reshape(-1, 80), want_y), (gx.reshape(-1, 96), want_gx), (gw, want_gw)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_an_outlier_row_keeps_the_other_rows_precise():
    """One token 2^16 times larger: a per-tensor scale pushes the other tokens' values into e4m3's subnormals and
    below (their error grows to tens of percent), a scale per row leaves each as close as e4m3's rounding of x and W
    makes it (5-6 % by norm here)."""
    torch.manual_seed(22)
    x = torch.randn(16, 64)
    x[3] *= 2.0**16
    w = torch.randn(32, 64) / 8
    exact = x @ w.t()
    errors = {}
    for recipe in ("dynamic", "rowwise"):
        layer = Float8Linear(64, 32, bias=False, recipe=recipe)
        layer.weight.data.copy_(w)
        with torch.no_grad():
            got = layer(x)
        rows = [r for r in range(16) if r != 3]
        errors[recipe] = ((got - exact)[rows].norm(dim=1) / exact[rows].norm(dim=1)).max().item()
    assert errors["rowwise"] < 0.1 and errors["dynamic"] > 0.3, errors


def test_rowwise_traces_fullgraph_and_matches_eager_bitwise():
    torch.manual_seed(23)
    eager = Float8Linear(32, 48, bias=True, recipe="rowwise")
    traced = copy.deepcopy(eager)
    compiled = torch.compile(traced, fullgraph=True, backend="aot_eager")
    x, dy = torch.randn(4, 8, 32), torch.randn(4, 8, 48)
    for got, want in zip(grads(compiled, x, dy), grads(eager, x, dy)):
        assert torch.equal(got, want)
    assert torch.equal(traced.bias.grad, eager.bias.grad)
