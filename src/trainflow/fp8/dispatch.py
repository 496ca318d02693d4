"""Which implementation runs each fp8 GEMM shape on Hopper, by measurement: one of the sm90 kernel's configurations
(kernels/fp8_gemm_sm90.cu, trainflow.fp8.shapes) or torch._scaled_mm (cuBLASLt), whichever the GPU check timed fastest.

    python -c "from trainflow.fp8.kernels import committed; print(committed('NVIDIA H200', sm_count=132).choose( \
        8192, 128, 8192).reason)"

kernels/measured.json holds, per device and build, each benchmark shape's median seconds per GEMM of every
configuration and of _scaled_mm (ShapeTiming, from benchmarks/fp8_gemm.py). Per (M, N, K), once per process:
- measured: the fastest of the candidates at exactly that shape runs;
- unmeasured: the fastest at the nearest measured shape, nearest by the sum of |log2| of the ratios of M, N and K
  (a GEMM's time and which implementation wins follow its sizes' orders of magnitude, not their differences);
- nothing measured: the heuristic (trainflow.fp8.shapes), its reason saying "not yet measured".
The candidates are every configuration and _scaled_mm, except where the kernel is forced ($TRAINFLOW_FP8_BACKEND
=kernel: the GPU check's tests), which leaves out _scaled_mm. Each choice keeps its one-line reason (`choices()`),
which the GPU check and the benchmark report.
"""

from __future__ import annotations

import math

from trainflow.fp8.shapes import BY_NAME, SCALED_MM, ShapeChoice, ShapeTiming, heuristic


def distance(a: tuple[int, int, int], b: list[int]) -> float:
    """How far two GEMM shapes are apart: the sum of |log2| of the ratios of M, N and K."""
    return sum(abs(math.log2(x / y)) for x, y in zip(a, b))


def ranked(timing: ShapeTiming, candidates: set[str]) -> list[tuple[str, float]]:
    """The candidates `timing` measured, fastest first."""
    return sorted(((n, s) for n, s in timing.seconds.items() if n in candidates), key=lambda pair: pair[1])


def fastest_at(timing: ShapeTiming, candidates: set[str]) -> tuple[str, str] | None:
    """(the fastest candidate `timing` measured, its figures in words), or None where it measured none of them."""
    order = ranked(timing, candidates)
    if not order:
        return None
    runner_up = f", next {order[1][0]} {order[1][1] * 1e3:.3f} ms" if len(order) > 1 else ""
    return order[0][0], f"{order[0][1] * 1e3:.3f} ms of {len(order)} measured{runner_up}"


class ShapeDispatch:
    """The runner per (M, N, K) on one device, chosen once per shape and remembered with its reason."""

    def __init__(self, timings: list[ShapeTiming], device: str, *, sm_count: int, scaled_mm: bool = True):
        self.timings, self.device, self.sm_count = timings, device, sm_count
        self.candidates = set(BY_NAME) | ({SCALED_MM} if scaled_mm else set())
        self.chosen: dict[tuple[int, int, int], ShapeChoice] = {}

    def choose(self, m: int, n: int, k: int) -> ShapeChoice:
        if (m, n, k) not in self.chosen:
            self.chosen[(m, n, k)] = self._choice((m, n, k))
        return self.chosen[(m, n, k)]

    def _choice(self, mnk: tuple[int, int, int]) -> ShapeChoice:
        usable = [t for t in self.timings if ranked(t, self.candidates)]
        if not usable:
            return heuristic(*mnk, sm_count=self.sm_count)
        near = min(usable, key=lambda t: distance(mnk, t.mnk))
        runner, figures = fastest_at(near, self.candidates)
        where = "x".join(map(str, near.mnk))
        if tuple(near.mnk) == mnk:
            return ShapeChoice(runner, f"{runner}: measured fastest here, {figures} ({near.shape} on {self.device})")
        away = distance(mnk, near.mnk)
        return ShapeChoice(
            runner,
            f"{runner}: fastest at the nearest measured shape, {near.shape} ({where}, log2 distance {away:.1f}): "
            f"{figures} on {self.device}",
        )

    def choices(self) -> dict[str, str]:
        """{"MxNxK": "runner: why"} for every shape run so far."""
        return {"x".join(map(str, mnk)): c.reason for mnk, c in self.chosen.items()}


def kernel_shapes(timings: list[ShapeTiming]) -> list[str]:
    """The measured shapes where a configuration of the kernel is faster than torch._scaled_mm and the others."""
    every = set(BY_NAME) | {SCALED_MM}
    return [t.shape for t in timings if (best := fastest_at(t, every)) and best[0] != SCALED_MM]
