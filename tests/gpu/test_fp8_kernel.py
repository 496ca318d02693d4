"""The fp8 GEMMs on a CUDA GPU against exact (fp64) sums. Skipped without a GPU, except the bound's own check.

    .venv/bin/python -m pytest tests/gpu/test_fp8_kernel.py -q -rs

Implementations run on the GPU: `kernel`, this architecture's kernel of kernels/ called through its own op
(trainflow::fp8_gemm_sm89 or _sm90, built here; on sm_90 its default configuration, cooperative_s1), each other
configuration of the sm_90 kernel (`kernel_<config>`, trainflow.fp8.shapes.SM90_CONFIGS; skipped elsewhere), and
`dispatched`, trainflow::fp8_gemm as load_backend set it up (on sm_90 torch._scaled_mm until kernels/measured.json
says otherwise; the kernel in its per-shape configuration where it is forced). Each is checked element-wise against
trainflow.fp8.ops.error_bound, the error fp32 promotion every 128 of K allows, on: M, N, K tails (not multiples of
any tile, K not of 16), m or n of 1, k = 0, e4m3 and e5m2 A, per-tensor and per-row scales, fp32 and bf16 output,
and K = 8192 on same-sign data, where accumulating the whole K inside the tensor core would break the bound by 2.5x
to 5x. That last claim rests on a model of the tensor core's accumulator (13 or 14 mantissa bits, truncated), so the
one CPU test here emulates both accumulations and checks that the bound holds for the promoted one and fails for the
other: the GPU tests then catch a kernel that does not promote.
"""

from __future__ import annotations

import os

import pytest
import torch

from trainflow.fp8.build import build_extension
from trainflow.fp8.cache import cache_folder
from trainflow.fp8.cast import E4M3, E5M2
from trainflow.fp8.kernels import KERNEL_BUILDS, backend_reason, load_backend, shape_choices
from trainflow.fp8.ops import MMA_K, PROMOTE_K, bf16_half_spacing, error_bound, fp8_gemm, reference_fp8_gemm
from trainflow.fp8.shapes import BY_NAME, DEFAULT, SCALED_MM, SM90_CONFIGS

IMPLEMENTATIONS = ["kernel", "dispatched", *(f"kernel_{c.name}" for c in SM90_CONFIGS if c != DEFAULT)]
SHAPES = [(37, 23, 50), (300, 200, 96), (256, 384, 1000), (1, 129, 64), (77, 1, 48), (130, 260, 8), (16, 16, 0)]


def random_fp8(rows: int, cols: int, dtype: torch.dtype, seed: int, same_sign: bool = False, device="cpu"):
    """fp8 values drawn fresh per seed: normal * 64 (a spread of exponents), or uniform in [1, 2] (same sign)."""
    g = torch.Generator(device=device).manual_seed(seed)
    if same_sign:
        x = 1 + torch.rand(rows, cols, generator=g, device=device)
    else:
        x = (torch.randn(rows, cols, generator=g, device=device) * 64).clamp(-448, 448)
    return x.to(dtype)


def truncate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x (float64) cut toward zero to `bits` mantissa bits after the leading one: the tensor core's accumulator."""
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2^exponent, |mantissa| in [0.5, 1)
    return torch.ldexp(torch.trunc(mantissa * 2.0 ** (bits + 1)), exponent - bits - 1)


def emulated_gemm(a: torch.Tensor, b: torch.Tensor, bits: int, promote: bool) -> torch.Tensor:
    """a b^T (float64 in, float64 out) as a tensor core of `bits` accumulator bits computes it, one MMA_K
    instruction at a time: into one running sum over the whole K, or, promoted, into a partial begun from zero
    every PROMOTE_K and then added to an fp32 sum."""
    products = (a[:, None, :] * b[None, :, :]).reshape(a.shape[0], b.shape[0], -1, MMA_K).sum(-1)  # (M, N, K/32)
    total = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    partial = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    for i in range(products.shape[-1]):
        partial = truncate(partial + products[..., i], bits)
        if promote and (i + 1) % (PROMOTE_K // MMA_K) == 0:
            total, partial = total + partial.float(), torch.zeros_like(partial)
    return total.double() + partial if promote else partial


@pytest.mark.parametrize("bits", [13, 14])
def test_the_bound_holds_for_promotion_and_fails_for_whole_k_accumulation(bits):
    a = random_fp8(8, 8192, E4M3, seed=1, same_sign=True).double()
    b = random_fp8(8, 8192, E4M3, seed=2, same_sign=True).double()
    exact, one = a @ b.t(), torch.ones(1, dtype=torch.float64)
    bound = error_bound(a, b, one, one, exact, torch.float32)
    promoted = (emulated_gemm(a, b, bits, promote=True) - exact).abs() / bound
    whole_k = (emulated_gemm(a, b, bits, promote=False) - exact).abs() / bound
    assert promoted.max() < 0.5, f"promotion at {bits} bits uses {promoted.max():.2f} of the bound"
    assert whole_k.min() > 1.5, f"whole-K accumulation at {bits} bits stays within {whole_k.min():.2f} of it"


@pytest.fixture(scope="module")
def implementations() -> dict:
    """'kernel': this GPU's kernel op, built here; 'kernel_<config>': the sm90 op in each other configuration;
    'dispatched': fp8_gemm after load_backend chose for this GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    capability = torch.cuda.get_device_capability()
    if capability not in KERNEL_BUILDS:
        pytest.skip(f"kernels/ has no kernel for sm_{capability[0]}{capability[1]}")
    build, library, _ = build_extension(capability, cache_folder())  # compiled once, then found in the cache
    torch.ops.load_library(str(library))
    load_backend(torch.device("cuda"))
    op = getattr(torch.ops.trainflow, f"fp8_gemm_{build.arch}")
    configs = {f"kernel_{c.name}": lambda *args, c=c: op(*args, int(c.schedule), c.swizzle) for c in build.configs}
    return {"kernel": op, "dispatched": fp8_gemm, **configs}


def implementation(implementations: dict, name: str):
    if name not in implementations:
        pytest.skip(f"{name} is a configuration of the sm90 kernel; this GPU runs another architecture's")
    return implementations[name]


def check(gemm, a, b, sa, sb, out_dtype) -> None:
    """gemm against fp64 sums, element-wise within error_bound, every element finite (all written)."""
    exact = (a.double() @ b.double().t()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    got = gemm(a, b, sa, sb, out_dtype)
    assert got.shape == exact.shape and got.dtype == out_dtype
    err = (got.double() - exact).abs()
    over = err / error_bound(a, b, sa, sb, exact, out_dtype).clamp(min=1e-300)
    assert torch.isfinite(got).all() and (over <= 1).all(), f"worst error {over.max().item():.3g}x the bound"


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("a_dtype", [E4M3, E5M2])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_row", [False, True])
def test_matches_exact_sums_on_tails_and_edges(implementations, impl, a_dtype, out_dtype, per_row):
    for seed, (m, n, k) in enumerate(SHAPES):
        a = random_fp8(m, k, a_dtype, seed=10 * seed, device="cuda")
        b = random_fp8(n, k, E4M3, seed=10 * seed + 1, device="cuda")
        sa = torch.rand(m if per_row else 1, device="cuda") + 0.01
        sb = torch.rand(n if per_row else 1, device="cuda") + 0.01
        check(implementation(implementations, impl), a, b, sa, sb, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("same_sign", [True, False])
def test_long_k_stays_within_the_fp32_promotion_bound(implementations, impl, same_sign):
    a = random_fp8(512, 8192, E4M3, seed=3, same_sign=same_sign, device="cuda")
    b = random_fp8(384, 8192, E4M3, seed=4, same_sign=same_sign, device="cuda")
    sa, sb = torch.rand(512, device="cuda") + 0.5, torch.tensor([0.75], device="cuda")
    check(implementation(implementations, impl), a, b, sa, sb, torch.float32)


def round_toward_zero_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 by cutting the low 16 bits: what a conversion that truncates instead of rounding writes."""
    return (x.float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


def bf16_over_half_spacing(bf16: torch.Tensor, fp32: torch.Tensor) -> torch.Tensor:
    """How far a bf16 result lies from the fp32 result it was written from, in half bf16 spacings: <= 1 rounds to
    nearest; a conversion that rounds toward zero lands up to 2 away, on about half the elements beyond 1."""
    return (bf16.double() - fp32.double()).abs() / bf16_half_spacing(fp32.double().abs()).clamp(min=1e-300)


def test_the_bf16_check_holds_round_to_nearest_and_fails_round_toward_zero():
    a, b = random_fp8(64, 256, E4M3, seed=5), random_fp8(48, 256, E4M3, seed=6)
    fp32 = reference_fp8_gemm(a, b, torch.ones(1), torch.ones(1), torch.float32)
    assert bf16_over_half_spacing(fp32.to(torch.bfloat16), fp32).max() <= 1
    toward_zero = bf16_over_half_spacing(round_toward_zero_bf16(fp32), fp32)
    assert (toward_zero > 1).float().mean() > 0.3, (
        f"round toward zero passes on {(toward_zero <= 1).float().mean():.0%}"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("per_row", [False, True])
def test_bf16_output_is_the_fp32_result_rounded_to_nearest(implementations, impl, per_row):
    """The bf16 epilogue writes the fp32 result rounded to nearest: error_bound's accumulation term is far larger
    than a bf16 spacing on random data, so only this comparison with the same GEMM's fp32 output sees the rounding."""
    a, b = random_fp8(256, 384, E4M3, seed=11, device="cuda"), random_fp8(320, 384, E4M3, seed=12, device="cuda")
    sa = torch.rand(256 if per_row else 1, device="cuda") + 0.01
    sb = torch.rand(320 if per_row else 1, device="cuda") + 0.01
    gemm = implementation(implementations, impl)
    over = bf16_over_half_spacing(gemm(a, b, sa, sb, torch.bfloat16), gemm(a, b, sa, sb, torch.float32))
    assert over.max() <= 1 + 2**-16, f"{(over > 1).float().mean():.1%} of the bf16 outputs are not rounded to nearest"


def views(a: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values as a (rows, cols) fp8 tensor laid out as `kind`: a row-offset view (a slice of a larger
    tensor), a view whose base is 1 byte off 16-byte alignment, or a non-contiguous (transposed) view."""
    rows, cols = a.shape
    if kind == "offset":
        big = torch.zeros(rows + 3, cols, dtype=torch.uint8, device=a.device)
        big[3:] = a.view(torch.uint8)
        return big[3:].view(a.dtype)
    if kind == "misaligned":
        flat = torch.zeros(rows * cols + 1, dtype=torch.uint8, device=a.device)
        flat[1:] = a.reshape(-1).view(torch.uint8)
        return flat[1:].view(rows, cols).view(a.dtype)
    return a.view(torch.uint8).t().contiguous().t().view(a.dtype)  # column-major: strides (1, rows)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["offset", "misaligned", "non_contiguous"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_views_of_any_layout_give_the_contiguous_result(implementations, impl, kind, out_dtype):
    a = random_fp8(300, 96, E4M3, seed=7, device="cuda")
    b = random_fp8(200, 96, E4M3, seed=8, device="cuda")
    sa, sb = torch.rand(300, device="cuda") + 0.01, torch.rand(1, device="cuda") + 0.01
    va, vb = views(a, kind), views(b, kind)
    assert torch.equal(va.view(torch.uint8), a.view(torch.uint8)) and (kind == "non_contiguous") != va.is_contiguous()
    check(implementation(implementations, impl), va, vb, sa, sb, out_dtype)
    gemm = implementation(implementations, impl)
    assert torch.equal(gemm(va, vb, sa, sb, out_dtype), gemm(a, b, sa, sb, out_dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("a_dtype", [E4M3, E5M2])
def test_nan_and_inf_inputs_spread_as_in_exact_arithmetic(implementations, impl, a_dtype):
    """A NaN in a row of A makes that row of C NaN; e5m2's inf makes its row inf, or NaN where a product is
    inf * 0 or two infinities of opposite sign meet; every other element stays finite and within the bound."""
    a = random_fp8(64, 128, a_dtype, seed=9, device="cuda")
    b = random_fp8(48, 128, E4M3, seed=10, device="cuda")
    a[3, 5] = float("nan")
    if a_dtype == E5M2:
        a[7, 9] = float("inf")
    one = torch.ones(1, device="cuda")
    got = implementation(implementations, impl)(a, b, one, one, torch.float32).double()
    exact = a.double() @ b.double().t()
    assert torch.equal(torch.isnan(got), torch.isnan(exact)) and torch.equal(torch.isinf(got), torch.isinf(exact))
    assert torch.equal(got[torch.isinf(exact)], exact[torch.isinf(exact)])  # the same signs
    finite = torch.isfinite(exact)
    over = (got - exact).abs()[finite] / error_bound(a, b, one, one, exact, torch.float32)[finite].clamp(min=1e-300)
    assert over.max() <= 1 and finite.sum() < exact.numel()


@pytest.mark.gpu
def test_the_dispatch_records_each_shape_s_runner_and_why(implementations):
    """Where the sm90 kernel is loaded (measured fastest on some shape, or forced as the GPU check forces it), each
    shape that ran has its runner and reason: measured there, learnt from the nearest measured shape, or (nothing
    measured for this build) the heuristic's; a forced kernel never hands a shape to _scaled_mm."""
    if "sm90_kernel" not in backend_reason(torch.device("cuda")).split(":")[0]:
        pytest.skip("fp8_gemm does not run the sm90 kernel here (set TRAINFLOW_FP8_BACKEND=kernel on Hopper)")
    a, b = random_fp8(8192, 8192, E4M3, seed=13, device="cuda"), random_fp8(128, 8192, E4M3, seed=14, device="cuda")
    one = torch.ones(1, device="cuda")
    check(fp8_gemm, a[:512], b, one, one, torch.bfloat16)  # 4 tiles of 128x128
    fp8_gemm(a, b, one, one, torch.bfloat16)
    choices = shape_choices()
    assert {"512x128x8192", "8192x128x8192"} <= set(choices), f"shapes the dispatch recorded: {choices}"
    forced = os.environ.get("TRAINFLOW_FP8_BACKEND") == "kernel"
    for shape, why in choices.items():
        runner = why.split(":")[0]
        assert runner in BY_NAME or (runner == SCALED_MM and not forced), f"{shape} (forced {forced}): {why}"
        assert any(w in why for w in ("measured fastest here", "nearest measured shape", "not yet measured")), why
