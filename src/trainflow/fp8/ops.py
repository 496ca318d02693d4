"""The torch op trainflow::fp8_gemm: its schema, its reference (CPU) implementation, its fake, and its CUDA loader.

    python -m trainflow.fp8        # on a GPU node: build kernels/ and register it as fp8_gemm's CUDA implementation

fp8_gemm(a, b, scale_a, scale_b, out_dtype) = diag(scale_a) (a b^T) diag(scale_b) in out_dtype, with a (M, K)
e4m3 or e5m2, b (N, K) e4m3 (a Linear weight's layout), each scale one fp32 value or one per row of its operand
(dequantisation multipliers: 1 / the quantisation scale), out_dtype float32 or bfloat16.

The layout is pytorch/extension-cpp's: the schema is declared here, once; the CPU implementation is plain
PyTorch and doubles as the test oracle; `register_fake` lets torch.compile trace the op; the CUDA
implementation is kernels/fp8_gemm.cu, registered by kernels/fp8_binding.cpp when `load_backend` builds it
with torch.utils.cpp_extension. Where that build fails, `torch._scaled_mm` (cuBLASLt) becomes the CUDA
implementation, with one warning that says how to build the kernel; nothing falls back to bf16 silently.

Why the reference is exact up to summation order: fp8 -> fp32 is exact, and a product of two fp8 values has at
most 4 + 4 significant bits and an exponent far inside fp32's range, so it is exact in fp32 as the tensor
cores form it; the fp32 sums differ from the kernel's only in their order. The scales are applied after the
sums, as the kernel's epilogue does.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from trainflow.errors import ConfigError

OP = "trainflow::fp8_gemm"
KERNELS = Path(__file__).resolve().parents[3] / "kernels"
EXTENSION = "trainflow_fp8"
BUILD_HINT = "build it on a GPU node with `python -m trainflow.fp8` (needs nvcc and CUDA_HOME; kernels/README.md)"
A_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.float32, torch.bfloat16)
SCALED_MM_MULTIPLE = 16  # cuBLASLt's fp8 GEMM wants every dimension a multiple of 16

torch.library.define(OP, "(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType out_dtype) -> Tensor")


def fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """diag(scale_a) (a b^T) diag(scale_b) in out_dtype; see the module docstring."""
    return torch.ops.trainflow.fp8_gemm(a, b, scale_a, scale_b, out_dtype)


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
    """fp8_gemm through torch._scaled_mm (cuBLASLt): the CUDA implementation where kernels/ did not build.

    _scaled_mm wants dimensions in multiples of 16, so odd sizes are padded with zeros (which add nothing to the
    sums) and the result cut back. Per-tensor scales go to cuBLASLt; per-row ones are applied afterwards in fp32.
    """
    _check(a, b, scale_a, scale_b, out_dtype)
    m, n = a.shape[0], b.shape[0]
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


def build_extension(verbose: bool = False) -> None:
    """Compile kernels/ with torch.utils.cpp_extension (cached under TORCH_EXTENSIONS_DIR) and load it, which
    registers the kernel as fp8_gemm's CUDA implementation. Raises what the build raises."""
    from torch.utils import cpp_extension  # imported here: it probes for compilers and CUDA at import

    sources = [KERNELS / "fp8_gemm.cu", KERNELS / "fp8_binding.cpp"]
    if missing := [str(p) for p in sources if not p.is_file()]:
        raise FileNotFoundError(f"{', '.join(missing)} missing (trainflow is not installed from a checkout)")
    cpp_extension.load(
        name=EXTENSION,
        sources=[str(p) for p in sources],
        extra_include_paths=[str(KERNELS)],
        extra_cuda_cflags=["-O3"],
        is_python_module=False,
        verbose=verbose,
    )


def load_backend(device: torch.device) -> str:
    """Make fp8_gemm runnable on `device`; which implementation will run there: "reference" (CPU), "kernel"
    (kernels/ built and loaded) or "scaled_mm" (the build failed: one warning, then torch._scaled_mm)."""
    if device.type == "cpu":
        return "reference"
    if device.type != "cuda":
        raise ConfigError(f"train.fp8 runs on cpu or cuda devices, not {device.type}: set train.fp8=none")
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) < (8, 9):
        raise ConfigError(
            f"train.fp8 needs fp8 tensor cores (compute capability >= 8.9: Ada, Hopper); "
            f"{torch.cuda.get_device_name(index)} is {major}.{minor}: set train.fp8=none"
        )
    return _load_cuda()


@functools.cache
def _load_cuda() -> str:
    """Once per process: the kernel's build and load, else the fallback's registration and its one warning."""
    try:
        build_extension()
    except (RuntimeError, OSError, ImportError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        warnings.warn(
            f"trainflow.fp8: the CUDA kernel in kernels/ did not build ({reason}); torch._scaled_mm runs the fp8 "
            f"GEMMs instead: {BUILD_HINT}",
            stacklevel=3,
        )
        torch.library.impl(OP, "cuda")(scaled_mm_fp8_gemm)
        return "scaled_mm"
    return "kernel"
