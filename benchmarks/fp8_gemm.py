"""The FP8 GEMM on one GPU: kernels/fp8_gemm.cu against torch._scaled_mm (cuBLASLt) and a bf16 torch.matmul.

    python benchmarks/fp8_gemm.py [--quick] [--repeats 15]

Goal (issue 12): at 8192^3 the kernel reaches >= 0.7x torch._scaled_mm's TFLOP/s and >= 1.5x bf16 matmul's.
Anchors: cuBLASLt's fp8 GEMM on H100/H200 runs near 2x its bf16 GEMM (dense peaks 1979 vs 989 TFLOP/s);
kernels/ uses Ampere-style mma.sync, not Hopper's wgmma, so it is not expected to reach cuBLASLt.

First the kernel is built (torch.utils.cpp_extension, as `python -m trainflow.fp8` does) and checked against the
reference implementation (trainflow.fp8.ops.reference_fp8_gemm, run on the GPU): shapes with M, N, K tails
(not multiples of the 128 x 128 x 64 tile, K not a multiple of 16: the byte-wise load path), e4m3 and e5m2 A,
per-tensor and per-row scales, fp32 and bf16 output. Both sum exact fp8 products in fp32, so they may differ
only by summation order: |kernel - reference| <= (K + 2) 2^-24 (|A| |B|^T) |sa| |sb| (+ one bf16 rounding,
2^-8 relative to the kernel's fp32 value, for bf16 output); `worst_error_over_bound` must stay <= 1.

Then each shape is timed for the three GEMMs, (M, K) x (N, K)^T -> (M, N): the kernel and _scaled_mm on e4m3
operands with per-tensor scales and bf16 output, matmul on bf16 operands. Shapes: 4096^3, 8192^3, and the
linears of Llama 3 70B (dim 8192, ffn 28672, 64 query / 8 key-value heads of 128) under tp 8 for 8192 tokens
(one sequence of 8192): wq 8192 -> 1024, wk/wv 8192 -> 128, wo 1024 -> 8192, w1/w3 8192 -> 3584, w2 3584 -> 8192.
A repeat times ITERS back-to-back calls between CUDA events; the three GEMMs alternate in rotating order
within each repeat (clock and thermal drift cancel), and the median repeat gives TFLOP/s = 2 M N K / time.
"""

from __future__ import annotations

import argparse
import sys

import torch
from _common import emit, log, median

from trainflow.fp8.cast import E4M3, E5M2
from trainflow.fp8.ops import build_extension, fp8_gemm, reference_fp8_gemm

ITERS = 10  # GEMMs per timed repeat
WARMUP = 3
U32 = 2.0**-24
CHECKS = [(37, 23, 50), (300, 200, 96), (256, 384, 1000), (1024, 512, 4096)]  # (M, N, K)
SHAPES = {
    "4096^3": (4096, 4096, 4096),
    "8192^3": (8192, 8192, 8192),
    "70b_tp8_wq": (8192, 1024, 8192),
    "70b_tp8_wk_wv": (8192, 128, 8192),
    "70b_tp8_wo": (8192, 8192, 1024),
    "70b_tp8_w1_w3": (8192, 3584, 8192),
    "70b_tp8_w2": (8192, 8192, 3584),
}


def random_fp8(rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return (torch.randn(rows, cols, device=device) * 64).clamp(-448, 448).to(dtype)


def check(device: torch.device) -> dict:
    """The kernel against the reference on every check shape and variant; the worst error over its bound."""
    worst, cases = 0.0, 0
    for m, n, k in CHECKS:
        for a_dtype in (E4M3, E5M2):
            a, b = random_fp8(m, k, a_dtype, device), random_fp8(n, k, E4M3, device)
            for per_row in (False, True):
                sa = torch.rand(m if per_row else 1, device=device) + 0.01
                sb = torch.rand(n if per_row else 1, device=device) + 0.01
                magnitude = (a.float().abs() @ b.float().abs().t()) * sa.reshape(-1, 1) * sb.reshape(1, -1)
                for out_dtype in (torch.float32, torch.bfloat16):
                    got = fp8_gemm(a, b, sa, sb, out_dtype).float()
                    want = reference_fp8_gemm(a, b, sa, sb, torch.float32)
                    bound = (k + 2) * U32 * magnitude
                    if out_dtype == torch.bfloat16:  # one rounding of the kernel's own fp32 sum
                        bound = bound + 2.0**-8 * (want.abs() + bound)
                    worst = max(worst, ((got - want).abs() / bound.clamp(min=1e-30)).max().item())
                    cases += 1
    return {"cases": cases, "shapes_mnk": CHECKS, "worst_error_over_bound": round(worst, 4), "passed": worst <= 1}


def time_shape(m: int, n: int, k: int, repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds per GEMM of the kernel, _scaled_mm and bf16 matmul at (M, N, K)."""
    a8, b8 = random_fp8(m, k, E4M3, device), random_fp8(n, k, E4M3, device)
    one = torch.ones((), device=device)
    a16, b16 = a8.to(torch.bfloat16), b8.to(torch.bfloat16)
    gemms = {
        "kernel": lambda: fp8_gemm(a8, b8, one, one, torch.bfloat16),
        "scaled_mm": lambda: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16),
        "bf16_matmul": lambda: a16 @ b16.t(),
    }
    for fn in gemms.values():
        for _ in range(WARMUP):
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in gemms}
    names = list(gemms)
    for r in range(repeats):
        for name in names[r % 3 :] + names[: r % 3]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(ITERS):
                gemms[name]()
            end.record()
            end.synchronize()
            seconds[name].append(start.elapsed_time(end) / 1e3 / ITERS)
    return {name: median(s) for name, s in seconds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 repeats and only 4096^3 and 8192^3")
    ap.add_argument("--repeats", type=int, default=15, help="timed repeats per shape and GEMM (default 15)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("fp8_gemm: needs a CUDA GPU with fp8 tensor cores (sm_89+); none here, nothing measured")
        sys.exit(0)
    if args.repeats < 1:
        sys.exit(f"fp8_gemm: --repeats {args.repeats}: need at least 1")
    device = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        sys.exit(f"fp8_gemm: {torch.cuda.get_device_name()} is sm_{major}{minor}; fp8 tensor cores need sm_89+")
    repeats = 5 if args.quick else args.repeats
    log("fp8_gemm: building kernels/ (torch.utils.cpp_extension; cached after the first build)")
    build_extension()
    log("fp8_gemm: checking the kernel against the reference")
    correctness = check(device)
    shapes = {k: v for k, v in SHAPES.items() if not args.quick or k in ("4096^3", "8192^3")}
    results = []
    for name, (m, n, k) in shapes.items():
        log(f"fp8_gemm: timing {name} (M={m}, N={n}, K={k}), {repeats} repeats of {ITERS}")
        seconds = time_shape(m, n, k, repeats, device)
        tflops = {g: 2 * m * n * k / s / 1e12 for g, s in seconds.items()}
        results.append(
            {
                "shape": name,
                "mnk": [m, n, k],
                "tflops": {g: round(v, 1) for g, v in tflops.items()},
                "kernel_over_scaled_mm": round(tflops["kernel"] / tflops["scaled_mm"], 3),
                "kernel_over_bf16_matmul": round(tflops["kernel"] / tflops["bf16_matmul"], 3),
                "scaled_mm_over_bf16_matmul": round(tflops["scaled_mm"] / tflops["bf16_matmul"], 3),
            }
        )
    at_8192 = next(r for r in results if r["shape"] == "8192^3")
    emit(
        {
            "benchmark": "fp8_gemm",
            "device": torch.cuda.get_device_name(),
            "capability": f"sm_{major}{minor}",
            "correctness": correctness,
            "iters_per_repeat": ITERS,
            "repeats": repeats,
            "shapes": results,
            "goal_8192": {
                "kernel_over_scaled_mm": at_8192["kernel_over_scaled_mm"],
                "kernel_over_bf16_matmul": at_8192["kernel_over_bf16_matmul"],
                "met": at_8192["kernel_over_scaled_mm"] >= 0.7 and at_8192["kernel_over_bf16_matmul"] >= 1.5,
                "goal": ">= 0.7x torch._scaled_mm and >= 1.5x bf16 torch.matmul",
            },
        }
    )


if __name__ == "__main__":
    main()
