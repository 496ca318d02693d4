"""trainflow.fp8 on CPU: cast bounds and saturation, the reference fp8_gemm against float64 and against fp32 within
e4m3's rounding bound, Float8Linear's gradients against autograd of the dequantised computation, the delayed
recipe's history (rolls, saturation, state_dict), torch.compile, apply_fp8 and the size check (per tp rank); over 2
gloo ranks: test_fp8_ranks.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import make_config
from tests.support import grads
from trainflow.config.shape import linear_shapes
from trainflow.errors import ConfigError
from trainflow.fp8 import Float8Linear, apply_fp8, discard_amax, load_backend, sync_amax_history
from trainflow.fp8.cast import (
    E4M3,
    E5M2,
    MANTISSA_BITS,
    SUBNORMAL_SPACING,
    amax,
    dequantise,
    fp8_max,
    quantise,
    scale_from_amax,
)
from trainflow.fp8.ops import fp8_gemm, reference_fp8_gemm, scaled_mm_fp8_gemm
from trainflow.model import Llama, cross_entropy

U32 = 2.0**-24  # fp32's unit roundoff


def spread(n: int, seed: int) -> torch.Tensor:
    """n values of random sign with magnitudes log-uniform over 2^-20 .. 2^8: normals and subnormals once scaled."""
    g = torch.Generator().manual_seed(seed)
    mags = torch.exp2(torch.rand(n, generator=g) * 28 - 20)
    return mags * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)


def rounding_bound(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|dequantise(quantise(x)) - x| allowed per value: half an ulp relative (2^-(m+1)) plus half the subnormal
    spacing in x's units (both terms at once: a value is normal or subnormal, the sum covers either)."""
    return x.abs() * 2.0 ** -(MANTISSA_BITS[dtype] + 1) + SUBNORMAL_SPACING[dtype] / 2 / scale


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_round_trip_error_is_within_half_an_ulp(dtype):
    x = spread(20000, seed=1)
    s = scale_from_amax(amax(x), dtype)
    back = dequantise(quantise(x, s, dtype), s)
    err = (back - x).abs()
    assert (err <= rounding_bound(x, s, dtype)).all()
    normal = (x * s).abs() >= torch.finfo(dtype).smallest_normal
    worst = (err[normal] / x[normal].abs()).max().item()
    # Rounding to nearest with m mantissa bits: the worst relative error approaches h / (1 + h), h = 2^-(m+1)
    # (a value just past the midpoint above a power of two): e4m3 0.0588, e5m2 0.111. Fewer bits, or truncation,
    # would exceed it; a finer format would stay far below.
    h = 2.0 ** -(MANTISSA_BITS[dtype] + 1)
    assert 0.95 * h / (1 + h) < worst <= h / (1 + h)
    assert back.abs().max() == x.abs().max()  # the amax itself maps onto fp8's max: exact


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_cast_saturates_beyond_the_scaled_range(dtype):
    s = scale_from_amax(torch.tensor(1.0), dtype)  # a delayed scale from an amax of 1
    x = torch.tensor([1.0, 3.0, -1e30, float("inf"), float("nan")])
    q = quantise(x, s, dtype).float()
    top = fp8_max(dtype)
    assert q[:4].tolist() == [top, top, -top, top]
    assert q[4].isnan()


def test_margin_leaves_headroom():
    s = scale_from_amax(torch.tensor(3.0), E4M3, margin=2)
    assert (quantise(torch.tensor(3.0), s, E4M3).float() == 448 / 4).item()


def random_fp8(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 40).clamp(-fp8_max(E4M3), fp8_max(E4M3)).to(dtype)


@pytest.mark.parametrize("a_dtype", [E4M3, E5M2])
@pytest.mark.parametrize("per_row", [False, True])
def test_reference_gemm_is_exact_up_to_fp32_summation(a_dtype, per_row):
    """Against float64 (exact here): the products of fp8 values are exact in fp32, so the only errors are the
    K fp32 additions and the two epilogue multiplications: |out - exact| <= (K + 2) u32 (|a| |b|^T) |sa| |sb|."""
    m, n, k = 37, 23, 50  # no dimension a multiple of 16
    a, b = random_fp8((m, k), a_dtype, 2), random_fp8((n, k), E4M3, 3)
    g = torch.Generator().manual_seed(4)
    sa = torch.rand(m if per_row else 1, generator=g) + 0.01
    sb = torch.rand(n if per_row else 1, generator=g) + 0.01
    out = fp8_gemm(a, b, sa, sb, torch.float32)
    exact = (a.double() @ b.double().t()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    magnitude = (a.double().abs() @ b.double().abs().t()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    assert ((out.double() - exact).abs() <= (k + 2) * U32 * magnitude).all()
    bf16 = fp8_gemm(a, b, sa, sb, torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, out.to(torch.bfloat16))


def test_fp8_gemm_against_fp32_within_the_e4m3_bound():
    """The fp8 GEMM of fp32 matrices A (M, K), B (N, K), each quantised to e4m3 with its amax scale, against the
    fp32-exact A B^T. Derivation: e4m3 keeps 3 mantissa bits, so rounding to nearest moves a value by at most
    u = 2^-4 of itself where the scaled value is normal, and by at most eta = 2^-10 / s (half the subnormal
    spacing 2^-9, unscaled) below. So a' = a + da with |da| <= Ea = u|a| + eta_a, likewise b'. Then
    |a'b' - ab| = |da b' + a db| <= Ea |b| + (|a| + Ea) Eb  (using |b'| <= |b| + Eb and regrouping), summed over
    k: |C' - C| <= Ea |B|^T + (|A| + Ea) Eb^T, plus the fp32 sums of both sides (2 (K + 2) u32 |A||B|^T). The
    test asserts that bound element-wise and reports how close the worst element comes to it."""
    m, n, k = 64, 48, 256
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 0.02
    sa, sb = scale_from_amax(amax(a), E4M3), scale_from_amax(amax(b), E4M3)
    out = fp8_gemm(quantise(a, sa, E4M3), quantise(b, sb, E4M3), sa.reciprocal(), sb.reciprocal(), torch.float32)
    exact = a.double() @ b.double().t()
    u = 2.0**-4
    ea = u * a.abs().double() + 2.0**-10 / sa.double()
    eb = u * b.abs().double() + 2.0**-10 / sb.double()
    bound = ea @ b.abs().double().t() + (a.abs().double() + ea) @ eb.t()
    bound += 2 * (k + 2) * U32 * (a.abs().double() @ b.abs().double().t())
    err = (out.double() - exact).abs()
    assert (err <= bound).all()
    # Errors of random signs cancel: the typical error is far below the worst case, yet not zero (fp8 did round).
    relative = (err.norm() / exact.norm()).item()
    assert 1e-3 < relative < u


def test_scaled_mm_fallback_matches_the_reference():
    """The CUDA fallback's padding (to multiples of 16) and per-row path, run through torch._scaled_mm on CPU."""
    a, b = random_fp8((37, 50), E5M2, 6), random_fp8((23, 50), E4M3, 7)
    per_row = torch.linspace(0.5, 2.0, 37)
    for sa in (torch.tensor([0.25]), per_row):
        want = reference_fp8_gemm(a, b, sa, torch.tensor([0.5]), torch.float32)
        got = scaled_mm_fp8_gemm(a, b, sa, torch.tensor([0.5]), torch.float32)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _GradToE5M2(torch.autograd.Function):
    """Identity forward; backward rounds the gradient to e5m2 with its own amax scale (the test's oracle)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, amax_override: torch.Tensor | None) -> torch.Tensor:
        ctx.amax_override = amax_override
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        a = ctx.amax_override if ctx.amax_override is not None else amax(g)
        s = scale_from_amax(a, E5M2)
        return dequantise(quantise(g, s, E5M2), s), None


def dequantised_linear(x: torch.Tensor, w: torch.Tensor, x_amax=None, w_amax=None, g_amax=None) -> torch.Tensor:
    """fp32 autograd of the fp8 computation: x, W rounded to e4m3 (straight-through), the output's gradient
    rounded to e5m2. Its gradients are dy' W' and dy'^T x', the products Float8Linear's backward GEMMs form."""

    def e4m3(t, a):
        s = scale_from_amax(amax(t) if a is None else a, E4M3)
        return t + (dequantise(quantise(t, s, E4M3), s) - t).detach()

    return _GradToE5M2.apply(F.linear(e4m3(x.float(), x_amax), e4m3(w.float(), w_amax)), g_amax)


def test_float8_linear_gradients_match_autograd_of_the_dequantised_computation():
    torch.manual_seed(8)
    layer = Float8Linear(96, 80, bias=False, recipe="dynamic")
    x, dy = torch.randn(3, 7, 96), torch.randn(3, 7, 80) * 1e-3
    y, gx, gw = grads(layer, x, dy)
    xr = x.clone().requires_grad_()
    wr = layer.weight.detach().clone().requires_grad_()
    yr = dequantised_linear(xr, wr)
    yr.backward(dy)
    # Same fp8 operands, exact products: only fp32 summation order differs.
    for got, want in ((y, yr), (gx, xr.grad), (gw, wr.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # Against full precision the difference is fp8 rounding: a few percent, no more (e5m2 gradients: 2^-3 worst).
    full_x = x.clone().requires_grad_()
    wf = layer.weight.detach().clone().requires_grad_()
    F.linear(full_x, wf).backward(dy)
    for got, want in ((gx, full_x.grad), (gw, wf.grad)):
        assert (got - want).norm() / want.norm() < 0.1


def test_float8_linear_under_bf16_autocast():
    torch.manual_seed(9)
    layer = Float8Linear(64, 32, bias=True)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, gx, gw = grads(layer, x, torch.ones(2, 5, 32, dtype=torch.bfloat16))
    assert (y.dtype, gx.dtype, gw.dtype, layer.bias.grad.dtype) == (torch.bfloat16,) * 2 + (torch.float32,) * 2
    # Autocast changes only the output dtype: the GEMM itself stays fp8 x fp8 with fp32 sums (no bf16 matmul).
    y_plain, gx_plain, _ = grads(layer, x, torch.ones(2, 5, 32, dtype=torch.bfloat16))  # bf16 x: bf16 out
    assert torch.equal(y, y_plain) and torch.equal(gx, gx_plain)
    want = dequantised_linear(x.float(), layer.weight.detach()) + layer.bias.detach()
    torch.testing.assert_close(y.float(), want, rtol=2**-8, atol=2**-8 * want.abs().max().item())


def test_delayed_recipe_scales_from_the_history_and_rolls_it():
    torch.manual_seed(10)
    layer = Float8Linear(32, 16, bias=False, recipe="delayed", history_len=2)
    w = layer.weight.detach()
    x1, dy = torch.randn(4, 32), torch.randn(4, 16)
    y1, _, _ = grads(layer, x1, dy)  # empty history: scales from the current amaxes, as dynamic does
    torch.testing.assert_close(y1, dequantised_linear(x1, w))
    torch.testing.assert_close(layer.amax_pending, torch.stack((amax(x1), amax(w), amax(dy))))
    sync_amax_history([layer], None)
    assert torch.equal(layer.amax_history[:, 0], torch.stack((amax(x1), amax(w), amax(dy))))
    assert not layer.amax_pending.any()

    x2 = 0.5 * x1  # scaled with x1's amax from the history, not its own
    y2, gx2, gw2 = grads(layer, x2, dy)
    xr = x2.clone().requires_grad_()
    wr = w.clone().requires_grad_()
    dequantised_linear(xr, wr, x_amax=amax(x1), w_amax=amax(w), g_amax=amax(dy)).backward(dy)
    torch.testing.assert_close(gx2, xr.grad)
    torch.testing.assert_close(gw2, wr.grad)
    sync_amax_history([layer], None)
    x3 = 4 * x1  # beyond the history's amax (x1's): the largest values saturate at +-448 / scale
    y3, _, _ = grads(layer, x3, dy)
    torch.testing.assert_close(y3, dequantised_linear(x3, w, x_amax=amax(x1), w_amax=amax(w)))
    assert not torch.allclose(y3, dequantised_linear(x3, w))  # its own amax would not have clipped
    sync_amax_history([layer], None)
    assert torch.equal(layer.amax_history[0], torch.stack((amax(x3), amax(x2))))  # history_len 2: x1 rolled out


def test_a_step_not_applied_leaves_the_amax_history_as_it_was():
    # A loss spike's amaxes (here its input 1e4 times the usual): rolled into the history they would set the scale of
    # the next history_len steps, which would then quantise their ordinary values coarsely; the loss guard's skip
    # drops them instead (Parallelized.end_step(applied=False)).
    torch.manual_seed(12)
    layer = Float8Linear(32, 16, bias=False, recipe="delayed", history_len=4)
    x, dy = torch.randn(4, 32), torch.randn(4, 16)
    grads(layer, x, dy)
    sync_amax_history([layer], None)
    before = layer.state_dict()
    rolled = Float8Linear(32, 16, bias=False, recipe="delayed", history_len=4)
    rolled.load_state_dict(before)
    for m in (layer, rolled):
        grads(m, 1e4 * x, dy)
    discard_amax([layer])
    sync_amax_history([rolled], None)  # what a skipped step did before
    assert torch.equal(layer.amax_history, before["amax_history"]) and not layer.amax_pending.any()
    unspiked = Float8Linear(32, 16, bias=False, recipe="delayed", history_len=4)
    unspiked.load_state_dict(before)
    assert torch.equal(grads(layer, x, dy)[0], grads(unspiked, x, dy)[0])
    assert not torch.equal(grads(rolled, x, dy)[0], grads(unspiked, x, dy)[0])


def test_delayed_history_is_state_and_resumes_bitwise():
    torch.manual_seed(11)
    layer = Float8Linear(32, 16, bias=False, recipe="delayed", history_len=4)
    for scale in (1.0, 3.0):
        grads(layer, scale * torch.randn(8, 32), torch.randn(8, 16))
        sync_amax_history([layer], None)
    state = layer.state_dict()
    assert set(state) == {"weight", "amax_history"}
    resumed = Float8Linear(32, 16, bias=False, recipe="delayed", history_len=4)
    resumed.load_state_dict(state)
    x, dy = torch.randn(8, 32) * 5, torch.randn(8, 16)
    for got, want in zip(grads(resumed, x, dy), grads(layer, x, dy)):
        assert torch.equal(got, want)


def test_compile_traces_float8_linear_fullgraph():
    """Both recipes through dynamo and AOTAutograd (the fake of fp8_gemm, the backward's in-place amax record)
    in one graph; aot_eager runs the traced graph, so outputs, gradients and amaxes must equal eager's bitwise."""
    for recipe in ("dynamic", "delayed"):
        torch.manual_seed(12)
        eager = Float8Linear(32, 48, bias=True, recipe=recipe, history_len=4)
        traced = copy.deepcopy(eager)
        compiled = torch.compile(traced, fullgraph=True, backend="aot_eager")
        x, dy = torch.randn(4, 8, 32), torch.randn(4, 8, 48)
        for got, want in zip(grads(compiled, x, dy), grads(eager, x, dy)):
            assert torch.equal(got, want)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the output dtype is read from autocast in the graph
            assert torch.equal(compiled(x), eager(x)) and compiled(x).dtype == torch.bfloat16
        assert torch.equal(traced.bias.grad, eager.bias.grad)
        if recipe == "delayed":
            assert torch.equal(traced.amax_pending, eager.amax_pending) and traced.amax_pending.all()


def test_apply_fp8_swaps_only_the_block_linears(tmp_path):
    cfg = make_config("train_segment", tmp_path, "model=tiny")
    torch.manual_seed(13)
    model = Llama(cfg.model)
    plain = copy.deepcopy(model)
    params = dict(model.named_parameters())
    assert apply_fp8(model, recipe="delayed", history_len=8) == "reference"
    assert dict(model.named_parameters()) == params  # the same Parameter objects under the same names
    swapped = {n for n, mod in model.named_modules() if isinstance(mod, Float8Linear)}
    assert swapped == {f"layers.{i}.{name}" for i in range(cfg.model.n_layers) for name in linear_shapes(cfg.model)}
    assert type(model.output) is nn.Linear and type(model.tok_embeddings) is nn.Embedding
    assert set(model.state_dict()) - set(plain.state_dict()) == {f"{n}.amax_history" for n in swapped}
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 33))
    loss8 = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    loss = cross_entropy(plain(tokens[:, :-1]), tokens[:, 1:])
    # At initialisation the logits are small and fp8 rounding of the block GEMMs moves the loss by little.
    assert abs(loss8.item() - loss.item()) < 1e-3 * loss.item()


def test_sizes_not_multiples_of_16_are_refused_with_the_layer_and_the_fix(tmp_path):
    fp8 = ["model=tiny", "train.fp8=delayed", "train.precision=bf16"]
    make_config("train_segment", tmp_path, *fp8)  # the tiny model's linears are all multiples of 16
    # multiple_of 8 rounds the SwiGLU width 341 up to 344 = 16 * 21.5: only the feed-forward linears break.
    with pytest.raises(ConfigError) as err:
        make_config("train_segment", tmp_path, *fp8, "model.multiple_of=8")
    assert "train.fp8: layers.*.feed_forward.w1 is a 128 -> 344 Linear (and 2 more)" in str(err.value)
    assert "model.multiple_of a multiple of 16, or set train.fp8=none" in str(err.value) and "\n" not in str(err.value)
    # dim 120: every linear reads or writes the residual width.
    with pytest.raises(ConfigError, match=r"attention\.wq is a 120 -> 120 Linear \(and 6 more\)"):
        make_config("train_segment", tmp_path, *fp8, "model.dim=120")


def test_fp8_needs_bf16_and_sizes_per_tp_rank(tmp_path):
    with pytest.raises(ConfigError, match="train.fp8=delayed runs inside bf16 training .* set train.precision=bf16"):
        make_config("train_segment", tmp_path, "train.fp8=delayed")
    fp8 = ["model=tiny", "train.fp8=dynamic", "train.precision=bf16", "parallel=tp2"]
    make_config("train_segment", tmp_path, *fp8)  # tp composes: each rank's shares are multiples of 16
    # multiple_of 80 rounds the SwiGLU width 341 up to 400 = 16 * 25: whole, fine; split over 2 ranks, 200 is not.
    make_config("train_segment", tmp_path, *fp8[:3], "model.multiple_of=80")
    with pytest.raises(ConfigError) as err:
        make_config("train_segment", tmp_path, *fp8, "model.multiple_of=80")
    assert "layers.*.feed_forward.w1 is a 128 -> 200 Linear on each of parallel.tp(2) ranks (and 2 more)" in str(
        err.value
    )
    assert "model.multiple_of a multiple of 32" in str(err.value) and "\n" not in str(err.value)


def test_bad_recipe_and_device_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"train.fp8\('bf8'\) must be one of none, dynamic, delayed"):
        make_config("train_segment", tmp_path, "train.fp8=bf8")
    with pytest.raises(ConfigError, match="not meta"):
        load_backend(torch.device("meta"))
