"""FP8 training: casts (cast.py), the fp8_gemm op and its implementations (ops.py, kernels/), Float8Linear with
dynamic and delayed scaling (linear.py), and the swap of a Llama's block linears (apply.py).

    backend = apply_fp8(model, recipe="delayed", history_len=16)   # reference, sm89_kernel, sm90_kernel, scaled_mm
    ... per optimizer step, after backward: sync_amax_history(parts, dp_group, tp_group)   # each None if size 1
"""

from trainflow.fp8.apply import apply_fp8
from trainflow.fp8.kernels import backend_reason, load_backend
from trainflow.fp8.linear import RECIPES, Float8Linear, discard_amax, sync_amax_history

__all__ = [
    "RECIPES",
    "Float8Linear",
    "apply_fp8",
    "backend_reason",
    "discard_amax",
    "load_backend",
    "sync_amax_history",
]
