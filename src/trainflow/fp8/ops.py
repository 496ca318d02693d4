"""The torch op trainflow::fp8_gemm: its schema, its reference (CPU) implementation, its fake, torch._scaled_mm's
implementation and the error bound the kernels are held to. Which CUDA implementation runs it is chosen by
measured fact in trainflow.fp8.kernels.

    python -c "import torch; from trainflow.fp8.ops import fp8_gemm; a = torch.ones(4, 32).to(torch.float8_e4m3fn); \
        print(fp8_gemm(a, a, torch.ones(1), torch.ones(1), torch.float32))"

fp8_gemm(a, b, scale_a, scale_b, out_dtype) = diag(scale_a) (a b^T) diag(scale_b) in out_dtype, with a (M, K)
e4m3 or e5m2, b (N, K) e4m3 (a Linear weight's layout), each scale one fp32 value or one per row of its operand
(dequantisation multipliers: 1 / the quantisation scale), out_dtype float32 or bfloat16.

The layout is pytorch/extension-cpp's: the schema is declared here, once; the CPU implementation is plain
PyTorch and doubles as the test oracle; `register_fake` lets torch.compile trace the op. The CUDA
implementation is chosen per compute capability by trainflow.fp8.kernels.load_backend, and `backend_reason` says
why in one line:
- sm_89 (Ada): kernels/fp8_gemm.cu (mma.sync, fp32 promotion every 128 of K), op trainflow::fp8_gemm_sm89.
- sm_90 (Hopper): per GEMM shape, whichever of torch._scaled_mm (cuBLASLt) and the configurations of
  kernels/fp8_gemm_sm90.cu (CUTLASS wgmma + TMA, op trainflow::fp8_gemm_sm90) kernels/measured.json's GPU check of
  this device and these very sources (their SHA-256) timed fastest, there or at the nearest measured shape
  (trainflow.fp8.dispatch); torch._scaled_mm everywhere until such a check passed. Never the mma.sync kernel:
  Hopper has no fp8 mma.sync, nvcc emulates it with fp16 HMMA (kernels/README.md).
- anything else, or a kernel whose build is missing (one warning naming the cache): torch._scaled_mm; but with
  $TRAINFLOW_FP8_BACKEND=kernel a missing build is an error naming the cache and the build command.
Nothing falls back to bf16 silently.

Why the reference is exact up to summation order: fp8 -> fp32 is exact, and a product of two fp8 values has at
most 4 + 4 significant bits and an exponent far inside fp32's range, so it is exact in fp32 as the tensor
cores form it; the fp32 sums differ from the kernel's only in their order. The scales are applied after the
sums, as the kernels' epilogues do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

OP = "trainflow::fp8_gemm"
SCHEMA = "(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType out_dtype) -> Tensor"
A_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.float32, torch.bfloat16)
SCALED_MM_MULTIPLE = 16  # cuBLASLt's fp8 GEMM wants every dimension a multiple of 16
MMA_K = 32  # K of one fp8 tensor-core instruction (mma.sync m16n8k32, wgmma m64nNk32)
PROMOTE_K = 128  # both kernels add the tensor core's partial sums into fp32 at least every 128 of K
TENSOR_CORE_UNIT = 2.0**-13  # its fp8 accumulator keeps ~13 mantissa bits (SageAttention on Ada; ~14: DeepGEMM)


torch.library.define(OP, SCHEMA)


def fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """diag(scale_a) (a b^T) diag(scale_b) in out_dtype; see the module docstring."""
    return torch.ops.trainflow.fp8_gemm(a, b, scale_a, scale_b, out_dtype)


def gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The output dtype fp8_gemm writes for a wanted `dtype`: bf16 directly, anything else via fp32."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def _check(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: f"fp8_gemm: a and b must be 2-D, got {a.shape}, {b.shape}")
    torch._check(a.shape[1] == b.shape[1], lambda: f"fp8_gemm: a {tuple(a.shape)} and b {tuple(b.shape)} differ in K")
    torch._check(a.dtype in A_DTYPES, lambda: f"fp8_gemm: a must be float8_e4m3fn or float8_e5m2, got {a.dtype}")
    torch._check(b.dtype == torch.float8_e4m3fn, lambda: f"fp8_gemm: b must be float8_e4m3fn, got {b.dtype}")
    torch._check(out_dtype in OUT_DTYPES, lambda: f"fp8_gemm: out_dtype must be float32 or bfloat16, got {out_dtype}")
    _check_scale("scale_a", scale_a, a.shape[0])
    _check_scale("scale_b", scale_b, b.shape[0])


def _check_scale(name: str, scale: torch.Tensor, rows: int) -> None:
    torch._check(scale.dtype == torch.float32, lambda: f"fp8_gemm: {name} must be float32, got {scale.dtype}")
    torch._check(
        scale.numel() == 1 or scale.numel() == rows,
        lambda: f"fp8_gemm: {name} has {scale.numel()} values; it needs 1 (per tensor) or {rows} (per row)",
    )


def reference_fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """The oracle: exact fp32 products, fp32 sums, scales applied to the sums."""
    _check(a, b, scale_a, scale_b, out_dtype)
    # A Python kernel's ops dispatch afresh: under an enclosing autocast this matmul would run in bf16.
    with torch.autocast(a.device.type, enabled=False):
        acc = a.float() @ b.float().t()  # (M, N)
    return (acc * scale_a.reshape(-1, 1) * scale_b.reshape(1, -1)).to(out_dtype)


def fake_fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    _check(a, b, scale_a, scale_b, out_dtype)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


torch.library.impl(OP, "cpu")(reference_fp8_gemm)
torch.library.register_fake(OP)(fake_fp8_gemm)


def error_bound(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, exact: torch.Tensor, out_dtype
) -> torch.Tensor:
    """(M, N) float64: how far fp8_gemm may be from `exact` (the fp64 result) with fp32 promotion every PROMOTE_K.

    Within a slice of PROMOTE_K, the tensor core's partial sum passes PROMOTE_K / MMA_K = 4 instructions, each
    allowed 2 units of TENSOR_CORE_UNIT of the slice's sum of |a b| (one for its own sum of 32 products, one for
    the add into the partial): 8 * 2^-13 of sum |a b| over all slices, since each slice counts its |a b| once.
    The fp32 promotions and the two scale multiplications add (K / PROMOTE_K + 3) * 2^-24 of it; a bf16 output
    one rounding to nearest, half its spacing at the value (2^-9 to 2^-8 of it; rounding toward zero moves it up
    to a whole spacing, which tests/gpu/test_fp8_kernel.py tells apart against the same GEMM's fp32 output).
    Accumulating the whole K in the tensor core instead truncates a running sum that grows to sum |a b| on
    same-sign data at each of K / MMA_K instructions: at K = 8192, 40-50 units with 13 bits and 20-24 with 14 in
    the emulation of tests/gpu/test_fp8_kernel.py, 5x and 2.5x this bound.
    """
    magnitude = (a.double().abs() @ b.double().abs().t()) * scale_a.double().abs().reshape(-1, 1)
    magnitude = magnitude * scale_b.double().abs().reshape(1, -1)  # (M, N)
    k = a.shape[1]
    units = 2 * (PROMOTE_K // MMA_K) * TENSOR_CORE_UNIT + (-(-k // PROMOTE_K) + 3) * 2.0**-24
    bound = units * magnitude
    return bound + bf16_half_spacing(exact.abs() + bound) if out_dtype == torch.bfloat16 else bound


def bf16_half_spacing(magnitude: torch.Tensor) -> torch.Tensor:
    """Half the spacing of bf16 values at `magnitude` (>= 0): the most rounding to nearest moves a value there."""
    _, exponent = torch.frexp(magnitude)  # magnitude < 2^exponent: bf16's 7 stored bits space values 2^(exponent - 8)
    return torch.ldexp(torch.ones_like(magnitude), exponent - 9)


def _pad_to_multiple(q: torch.Tensor, multiple: int) -> torch.Tensor:
    """q (rows, cols) with zero rows and columns appended up to multiples of `multiple` (byte 0 is +0.0 in fp8)."""
    rows, cols = -q.shape[0] % multiple, -q.shape[1] % multiple
    if rows == 0 and cols == 0:
        return q
    # F.pad has no fp8 kernels; the bytes pad as uint8.
    return F.pad(q.view(torch.uint8), (0, cols, 0, rows)).view(q.dtype)


def scaled_mm_fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """fp8_gemm through torch._scaled_mm (cuBLASLt): the CUDA implementation wherever no kernel of ours is chosen.

    _scaled_mm wants dimensions in multiples of 16, so odd sizes are padded with zeros (which add nothing to the
    sums) and the result cut back. Per-tensor scales go to cuBLASLt; per-row ones are applied afterwards in fp32.
    """
    _check(a, b, scale_a, scale_b, out_dtype)
    m, n = a.shape[0], b.shape[0]
    if a.shape[1] == 0:  # empty sums are 0; cuBLASLt is not asked about K = 0
        return a.new_zeros((m, n), dtype=out_dtype)
    a_p, b_p = (
        _pad_to_multiple(a.contiguous(), SCALED_MM_MULTIPLE),
        _pad_to_multiple(b.contiguous(), SCALED_MM_MULTIPLE),
    )
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        out = torch._scaled_mm(a_p, b_p.t(), scale_a.reshape(()), scale_b.reshape(()), out_dtype=out_dtype)
        return out[:m, :n]
    one = torch.ones((), device=a.device)
    acc = torch._scaled_mm(a_p, b_p.t(), one, one, out_dtype=torch.float32)[:m, :n]
    return (acc * scale_a.reshape(-1, 1) * scale_b.reshape(1, -1)).to(out_dtype)
