"""The FP8 casts around each GEMM in one pass per tensor: the saturating cast, its transpose for the backward GEMM,
and the tensor's amax recorded for the delayed recipe's history, from one read of the tensor.

    q, qt = cast_pair(x, scale, torch.float8_e4m3fn, record_into=pending[0:1])   # trainflow.fp8.linear calls it

Design note. Eager PyTorch spends a pass over the tensor on each of amax (a reduction), the multiply, the clamp,
the cast, and one more on every transpose the backward GEMMs need (x^T, W^T, dY^T): four to six passes around a
GEMM that reads the tensor once, which is why fp8 ran slower than bf16 in eager mode on the H200 (0.83x, 2026-12-04).
With the delayed recipe the scale comes from the amax history, known before the pass, so one kernel reads a tile
once and writes both layouts of the fp8 tensor (row-major for this GEMM, transposed for the backward one, so the
backward transposes nothing) and folds |x| into the amax slot by an atomic max (the slot the history takes in at
the step's end). The dynamic recipe and a history not yet usable need the current amax before the scale, so they run
trainflow.fp8.cast.amax first and then the same kernel: two passes, still not six.

Implementations: `triton_cast_pair` (a Triton kernel, CUDA tensors in eager mode, where Triton is installed: it ships
with CUDA builds of torch) and `reference_cast_pair` (plain PyTorch: CPU, inside torch.compile, whose Inductor fuses
its ops itself, and the test oracle); both give the same bits, since
the cast is elementwise (x * scale in fp32, clamped to +-max, NaN kept, rounded to nearest even) and a max is exact.
tests/unit/test_fp8_fused.py runs the kernel under Triton's CPU interpreter against the reference and compiles it
ahead of time for sm_90a to check its SASS (hardware F2FP conversion, the tile read once, one atomic per tile).
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from trainflow.fp8.cast import fp8_max, quantise

TILE = 64  # a CTA's tile of the (rows, cols) tensor: 64 x 64 elements, 128 threads (4 warps)


def reference_cast_pair(
    t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, record_into: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in `dtype` row-major, its transpose contiguous), and max(record_into, amax |t|) into record_into."""
    q = quantise(t, scale, dtype)
    if record_into is not None:
        record_into.copy_(torch.maximum(record_into, t.detach().abs().amax().float().reshape(record_into.shape)))
    return q, q.t().contiguous()


@functools.cache
def triton_kernel():
    """The Triton kernel, defined on first use (Triton is imported only where it runs)."""
    import triton
    import triton.language as tl

    @triton.jit
    def cast_pair_kernel(x, q, qt, scale, amax, rows, cols, row_stride, fp8_max: tl.constexpr, tile: tl.constexpr):
        r = tl.program_id(0) * tile + tl.arange(0, tile)[:, None]  # (tile, 1)
        c = tl.program_id(1) * tile + tl.arange(0, tile)[None, :]  # (1, tile)
        inside = (r < rows) & (c < cols)
        v = tl.load(x + r * row_stride + c, mask=inside, other=0.0).to(tl.float32)  # the one read of the tile
        y = tl.maximum(v * tl.load(scale), -fp8_max, propagate_nan=tl.PropagateNan.ALL)  # saturate, NaN kept
        y = tl.minimum(y, fp8_max, propagate_nan=tl.PropagateNan.ALL).to(q.dtype.element_ty)
        tl.store(q + r * cols + c, y, mask=inside)
        tl.store(qt + c * rows + r, y, mask=inside)
        tile_amax = tl.max(tl.max(tl.abs(v), axis=1), axis=0)
        has_nan = tl.max(tl.max((v != v).to(tl.int32), axis=1), axis=0)
        tl.atomic_max(amax, tl.where(has_nan > 0, float("nan"), tile_amax))  # NaN as the reference's amax gives

    return cast_pair_kernel


def triton_cast_pair(
    t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, record_into: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """reference_cast_pair's result from one pass of the Triton kernel over `t` (2-D, unit column stride)."""
    rows, cols = t.shape
    if t.stride(1) != 1:
        t = t.contiguous()
    q = torch.empty((rows, cols), dtype=dtype, device=t.device)
    qt = torch.empty((cols, rows), dtype=dtype, device=t.device)
    if rows and cols:
        amax = record_into if record_into is not None else torch.zeros(1, device=t.device)
        grid = (-(-rows // TILE), -(-cols // TILE))
        triton_kernel()[grid](t, q, qt, scale.float(), amax, rows, cols, t.stride(0), fp8_max(dtype), TILE)
    return q, qt


HAS_TRITON = importlib.util.find_spec("triton") is not None


def triton_usable(t: torch.Tensor) -> bool:
    """Whether the Triton kernel runs `t`: a CUDA tensor where Triton is installed, outside torch.compile (whose
    Inductor fuses the reference's ops into one kernel of its own), of fewer than 2^31 values (its offsets are
    32-bit)."""
    return t.device.type == "cuda" and HAS_TRITON and not torch.compiler.is_compiling() and t.numel() < 2**31


def cast_pair(
    t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, record_into: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(t scaled and cast to `dtype`, saturating at +-max; its transpose, contiguous), with amax |t| folded into
    `record_into` (a 1-element fp32 tensor) where given: one pass on CUDA with Triton, the reference elsewhere."""
    implementation = triton_cast_pair if triton_usable(t) else reference_cast_pair
    return implementation(t, scale, dtype, record_into)
