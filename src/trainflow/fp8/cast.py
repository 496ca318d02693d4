"""FP8 casts with per-tensor scales: amax -> scale, saturating quantise, dequantise.

    s = scale_from_amax(x.abs().amax(), E4M3); q = quantise(x, s, E4M3); x_back = dequantise(q, s)

Design note. Two formats, as Transformer Engine and torchao use them: e4m3 (3 mantissa bits, max 448) for
weights and activations, whose values need precision more than range; e5m2 (2 mantissa bits, max 57344) for
gradients, whose spread across a tensor is wider. A scale maps the tensor's amax onto the format's largest
value (divided by 2^margin to leave headroom), so the whole tensor uses the format's range. `quantise` clamps
to +-max before the cast (saturation): a value beyond the amax a delayed scale was computed from lands on the
largest finite fp8 value instead of NaN (e4m3fn has no infinity) or infinity (e5m2). NaN stays NaN.

Round-trip error of a value x (measured in tests/unit/test_fp8.py): where |x * s| is at least the format's
smallest normal (2^-6 for e4m3, 2^-14 for e5m2), rounding to nearest is off by at most half a unit in the last
place, i.e. |x| * 2^-(mantissa bits + 1): 2^-4 for e4m3, 2^-3 for e5m2; below that (subnormals) by at most
half the subnormal spacing, 2^-10 / s for e4m3 and 2^-17 / s for e5m2.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
MANTISSA_BITS = {E4M3: 3, E5M2: 2}
SUBNORMAL_SPACING = {E4M3: 2.0**-9, E5M2: 2.0**-16}
AMAX_FLOOR = 1e-12  # an all-zero tensor gets a finite scale (torchao's EPS); its values quantise to 0 anyway


def fp8_max(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max


def amax(x: torch.Tensor) -> torch.Tensor:
    """The largest |value| of x as a 0-d fp32 tensor (no gradient, no host sync)."""
    return x.detach().abs().amax().float()


def scale_from_amax(amax: torch.Tensor, dtype: torch.dtype, margin: int = 0) -> torch.Tensor:
    """The quantisation multiplier that maps `amax` onto the format's largest value / 2^margin (fp32)."""
    return fp8_max(dtype) / (torch.clamp(amax.float(), min=AMAX_FLOOR) * 2.0**margin)


def quantise(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x * scale in `dtype`, saturated at +-max (computed in fp32, whatever x's dtype)."""
    limit = fp8_max(dtype)
    return (x.float() * scale).clamp(-limit, limit).to(dtype)


def dequantise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 values q stands for: q / scale."""
    return q.float() / scale
