"""This GPU's fp8 kernel (kernels/) against torch._scaled_mm (cuBLASLt) and a bf16 torch.matmul; exits 1 when the
kernel fails its check.

    python benchmarks/fp8_gemm.py [--quick] [--repeats 15]

Goal (issue 25), on one H200 at 8192^3: the Hopper kernel (kernels/fp8_gemm_sm90.cu) >= 0.9x torch._scaled_mm's
TFLOP/s and >= 1.6x bf16 matmul's. Anchors: cuBLASLt's fp8 GEMM on H100/H200 runs near 2x its bf16 GEMM (dense
peaks 1979 vs 989 TFLOP/s); a bf16 8192^3 matmul measured 769-798 TFLOP/s on this workplace's H200s.

First the kernel of this GPU's architecture is built (as `python -m trainflow.fp8` does) and each of its
configurations (sm90: trainflow.fp8.shapes.SM90_CONFIGS) checked against fp64 sums within
trainflow.fp8.ops.error_bound (fp32 promotion every 128 of K): shapes with M, N, K tails, e4m3 and e5m2 A,
per-tensor and per-row scales, fp32 and bf16 output, and K = 8192 on same-sign data, where whole-K accumulation in
the tensor core would fail; `worst_error_over_bound` must stay <= 1 for every configuration.

Then each shape is timed for the GEMMs, (M, K) x (N, K)^T -> (M, N): every configuration of the kernel (its own op)
and _scaled_mm on e4m3 operands with per-tensor scales and bf16 output (use_fast_accum off: both promote), matmul on
bf16 operands. A shape's `kernel` is its fastest configuration, which the dispatch runs once this record is
committed; `heuristic` is what it runs until then (trainflow.fp8.shapes). Shapes: 4096^3, 8192^3, and the linears of
Llama 3 70B (dim 8192, ffn 28672, 64 query / 8 key-value heads of 128) under tp 8 for 8192 tokens: wq 8192 -> 1024,
wk/wv 8192 -> 128, wo 1024 -> 8192, w1/w3 8192 -> 3584, w2 3584 -> 8192. A repeat times ITERS back-to-back calls
between CUDA events, on ROTATE input sets (more bytes than the 60 MB L2); the GEMMs alternate in rotating order
within each repeat (clock and thermal drift cancel), and the median repeat gives TFLOP/s = 2 M N K / time.

"measured" is {arch: trainflow.fp8.measured.KernelMeasurement}, the record scripts/gpu_check.sh merges into
kernels/measured.json (commit it from a GPU run) by device name and build key: the build's full key, whether it
passed, the seconds of the kernel and of _scaled_mm summed over the shapes, and each shape's seconds per
configuration and of _scaled_mm. On that device with that build, each GEMM shape then runs the fastest of them
measured there or at the nearest measured shape (trainflow.fp8.dispatch); a shape's `dispatch` says which.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from _common import emit, log, median

from trainflow.fp8.build import build_extension
from trainflow.fp8.cache import cache_folder
from trainflow.fp8.cast import E4M3, E5M2
from trainflow.fp8.dispatch import ShapeDispatch
from trainflow.fp8.kernels import KERNEL_BUILDS, KernelBuild, kernel_key
from trainflow.fp8.measured import GemmSeconds, KernelMeasurement
from trainflow.fp8.ops import error_bound
from trainflow.fp8.shapes import SCALED_MM, ShapeTiming, heuristic

ITERS = 10  # GEMMs per timed repeat
WARMUP = 3
ROTATE = 4  # input sets cycled through, so that repeats do not hit in L2
CHECKS = [(37, 23, 50), (300, 200, 96), (256, 384, 1000), (1, 129, 64), (77, 1, 48), (1024, 512, 4096)]
SHAPES = {
    "4096^3": (4096, 4096, 4096),
    "8192^3": (8192, 8192, 8192),
    "70b_tp8_wq": (8192, 1024, 8192),
    "70b_tp8_wk_wv": (8192, 128, 8192),
    "70b_tp8_wo": (8192, 8192, 1024),
    "70b_tp8_w1_w3": (8192, 3584, 8192),
    "70b_tp8_w2": (8192, 8192, 3584),
}
GOAL = {"kernel_over_scaled_mm": 0.9, "kernel_over_bf16_matmul": 1.6}


def random_fp8(rows: int, cols: int, dtype: torch.dtype, same_sign: bool = False) -> torch.Tensor:
    if same_sign:
        return (1 + torch.rand(rows, cols, device="cuda")).to(dtype)
    return (torch.randn(rows, cols, device="cuda") * 64).clamp(-448, 448).to(dtype)


def worst_over_bound(kernels: dict[str, Callable], a, b, sa, sb, out_dtype) -> dict[str, float]:
    """Each configuration's worst error over error_bound on one case; the fp64 reference computed once for all."""
    exact = (a.double() @ b.double().t()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    bound = error_bound(a, b, sa, sb, exact, out_dtype).clamp(min=1e-300)
    worst = {}
    for name, gemm in kernels.items():
        got = gemm(a, b, sa, sb, out_dtype).double()
        worst[name] = ((got - exact).abs() / bound).max().item() if torch.isfinite(got).all() else float("inf")
    return worst


def configurations(build: KernelBuild) -> dict[str, Callable]:
    """The kernel's op in each of its configurations, by name ('kernel' where it has one)."""
    op = getattr(torch.ops.trainflow, f"fp8_gemm_{build.arch}")
    if not build.configs:
        return {"kernel": op}
    return {c.name: lambda *args, c=c: op(*args, int(c.schedule), c.swizzle) for c in build.configs}


def check(kernels: dict[str, Callable]) -> dict:
    """Every configuration against fp64 sums on every check shape and variant; the worst error over its bound."""
    worst, cases = dict.fromkeys(kernels, 0.0), 0

    def case(*args) -> None:
        nonlocal cases
        for name, w in worst_over_bound(kernels, *args).items():
            worst[name] = max(worst[name], w)
        cases += 1

    for m, n, k in CHECKS:
        for a_dtype in (E4M3, E5M2):
            a, b = random_fp8(m, k, a_dtype), random_fp8(n, k, E4M3)
            for per_row in (False, True):
                sa = torch.rand(m if per_row else 1, device="cuda") + 0.01
                sb = torch.rand(n if per_row else 1, device="cuda") + 0.01
                for out_dtype in (torch.float32, torch.bfloat16):
                    case(a, b, sa, sb, out_dtype)
    a, b = random_fp8(512, 8192, E4M3, same_sign=True), random_fp8(384, 8192, E4M3, same_sign=True)
    one = torch.ones(1, device="cuda")
    case(a, b, one, one, torch.float32)
    shapes = [*CHECKS, (512, 384, 8192)]
    overall = max(worst.values())
    return {
        "cases": cases,
        "shapes_mnk": shapes,
        "worst_error_over_bound": round(overall, 4),
        "worst_by_config": {name: round(w, 4) for name, w in worst.items()},
        "passed": overall <= 1,
    }


def time_shape(kernels: dict[str, Callable], m: int, n: int, k: int, repeats: int) -> dict[str, float]:
    """Median seconds per GEMM of each kernel configuration, _scaled_mm and bf16 matmul at (M, N, K)."""
    a8 = [random_fp8(m, k, E4M3) for _ in range(ROTATE)]
    b8 = [random_fp8(n, k, E4M3) for _ in range(ROTATE)]
    a16, b16 = [x.to(torch.bfloat16) for x in a8], [x.to(torch.bfloat16) for x in b8]
    one = torch.ones((), device="cuda")
    gemms = {
        **{name: lambda i, g=g: g(a8[i], b8[i], one, one, torch.bfloat16) for name, g in kernels.items()},
        "scaled_mm": lambda i: torch._scaled_mm(a8[i], b8[i].t(), one, one, out_dtype=torch.bfloat16),
        "bf16_matmul": lambda i: a16[i] @ b16[i].t(),
    }
    for fn in gemms.values():
        for i in range(WARMUP):
            fn(i % ROTATE)
    seconds: dict[str, list[float]] = {name: [] for name in gemms}
    names = list(gemms)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(ITERS):
                gemms[name](i % ROTATE)
            end.record()
            end.synchronize()
            seconds[name].append(start.elapsed_time(end) / 1e3 / ITERS)
    return {name: median(s) for name, s in seconds.items()}


def sm_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def shape_result(name: str, mnk: tuple[int, int, int], timed: dict[str, float], configs: list[str]) -> dict:
    """One shape's figures; `kernel` is the fastest of `configs` (the dispatch's measured choice)."""
    m, n, k = mnk
    fastest = min(configs, key=timed.__getitem__)
    seconds = {"kernel": timed[fastest], "scaled_mm": timed["scaled_mm"], "bf16_matmul": timed["bf16_matmul"]}
    tflops = {g: 2 * m * n * k / s / 1e12 for g, s in seconds.items()}
    return {
        "shape": name,
        "mnk": list(mnk),
        "fastest_config": fastest,
        "heuristic": heuristic(m, n, k, sm_count()).reason if len(configs) > 1 else None,
        "config_seconds": {c: round(timed[c], 9) for c in configs},
        "config_tflops": {c: round(2 * m * n * k / timed[c] / 1e12, 1) for c in configs},
        "seconds": {g: round(s, 9) for g, s in seconds.items()},
        "tflops": {g: round(v, 1) for g, v in tflops.items()},
        "kernel_over_scaled_mm": round(tflops["kernel"] / tflops["scaled_mm"], 3),
        "kernel_over_bf16_matmul": round(tflops["kernel"] / tflops["bf16_matmul"], 3),
        "scaled_mm_over_bf16_matmul": round(tflops["scaled_mm"] / tflops["bf16_matmul"], 3),
    }


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
    capability = torch.cuda.get_device_capability()
    if capability not in KERNEL_BUILDS:
        sys.exit(f"fp8_gemm: {torch.cuda.get_device_name()} is sm_{capability[0]}{capability[1]}: kernels/ has none")
    repeats = 5 if args.quick else args.repeats
    log(f"fp8_gemm: building kernels/ into the build cache {cache_folder()} (trainflow.fp8.build), or finding it there")
    build, library, what = build_extension(capability, cache_folder())
    torch.ops.load_library(str(library))
    log(f"fp8_gemm: {library}: {what}")
    kernels = configurations(build)
    log(f"fp8_gemm: checking {build.source} against fp64 sums in {len(kernels)} configurations")
    correctness = check(kernels)
    shapes = {k: v for k, v in SHAPES.items() if not args.quick or k in ("4096^3", "8192^3")}
    results = []
    for name, mnk in shapes.items():
        log(f"fp8_gemm: timing {name} (M, N, K = {mnk}), {repeats} repeats of {ITERS}")
        results.append(shape_result(name, mnk, time_shape(kernels, *mnk, repeats), list(kernels)))
    at_8192 = next(r for r in results if r["shape"] == "8192^3")
    record = KernelMeasurement(
        build_key=kernel_key(build),
        correctness_passed=correctness["passed"],
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        shapes=list(shapes),
        seconds=GemmSeconds(**{g: round(sum(r["seconds"][g] for r in results), 9) for g in ("kernel", "scaled_mm")}),
        per_shape=[
            ShapeTiming(r["shape"], r["mnk"], r["config_seconds"] | {SCALED_MM: r["seconds"]["scaled_mm"]})
            for r in results
        ]
        if build.configs
        else [],
    )
    if build.configs:  # what the dispatch runs per shape from this record, once it is committed
        dispatch = ShapeDispatch(record.per_shape, record.device, sm_count=sm_count())
        for r in results:
            r["dispatch"] = dispatch.choose(*r["mnk"]).reason
    emit(
        {
            "benchmark": "fp8_gemm",
            "device": torch.cuda.get_device_name(),
            "capability": f"sm_{capability[0]}{capability[1]}",
            "kernel": build.source,
            "correctness": correctness,
            "iters_per_repeat": ITERS,
            "repeats": repeats,
            "shapes": results,
            "goal_8192": {g: at_8192[g] for g in GOAL}
            | {"met": all(at_8192[g] >= v for g, v in GOAL.items()), "goal": GOAL},
            "measured": {build.arch: record.to_json()},
        }
    )
    if not correctness["passed"]:
        sys.exit(f"fp8_gemm: {build.source} failed its check: {correctness['worst_error_over_bound']}x the bound")


if __name__ == "__main__":
    main()
