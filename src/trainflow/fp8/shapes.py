"""Which configuration of the Hopper kernel (kernels/fp8_gemm_sm90.cu) runs each GEMM shape, and why.

    python -c "from trainflow.fp8.shapes import heuristic; print(heuristic(8192, 128, 8192, sm_count=132).reason)"

The kernel holds three schedules (fp8_gemm.h's Fp8GemmSchedule) and takes the tile scheduler's raster swizzle at
run time; SM90_CONFIGS are the pairs the GPU check measures on every benchmark shape. Per (M, N, K):
- measured: kernels/measured.json's record of this device and build holds the shape's seconds per configuration
  (ShapeTiming, from benchmarks/fp8_gemm.py): the fastest runs;
- otherwise the heuristic below, its reason saying "not yet measured". With 128x128 tiles and `sm_count` SMs:
  fewer tiles than SMs (the 70B's N = 128 per tp8 rank: 64 tiles on 132 SMs) leaves SMs idle unless K is split:
  stream-K. K of at most PINGPONG_MAX_K leaves a tile few k-tiles, so its epilogue is a large share of its time:
  ping-pong overlaps it with the other warpgroup's mainloop. Otherwise cooperative (the promotion's waits are
  covered by the other warpgroup on the same tile). Operands larger than L2 (A's and B's bytes over L2_BYTES)
  take swizzle 8, so a wave of CTAs walks 8-tile bands and reuses what it loaded; smaller ones swizzle 1.
ShapeDispatch keeps each shape's choice and reason the first time the shape runs (`choices()`), which the GPU check
and the benchmark report.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trainflow.records import Record

TILE = 128  # the cooperative and stream-K configurations' tile side (M and N), and K of a k-tile
PINGPONG_MAX_K = 2048  # at most 16 k-tiles per tile: the epilogue's share is large (not yet measured)
L2_BYTES = 50 * 2**20  # H100's L2 (H200: 60 MB): operands beyond it are reread from HBM unless swizzled
SWIZZLE = 8


class Schedule(enum.IntEnum):
    """fp8_gemm.h's Fp8GemmSchedule (the values cross the C interface)."""

    COOPERATIVE = 0
    PINGPONG = 1
    STREAM_K = 2


@dataclass(frozen=True)
class KernelConfig:
    """One way the sm90 kernel runs: its schedule and the tile scheduler's max_swizzle_size (1, 2, 4 or 8)."""

    schedule: Schedule
    swizzle: int

    @property
    def name(self) -> str:
        return f"{self.schedule.name.lower()}_s{self.swizzle}"


DEFAULT = KernelConfig(Schedule.COOPERATIVE, 1)
SM90_CONFIGS = (
    DEFAULT,
    KernelConfig(Schedule.COOPERATIVE, SWIZZLE),
    KernelConfig(Schedule.PINGPONG, 1),
    KernelConfig(Schedule.PINGPONG, SWIZZLE),
    KernelConfig(Schedule.STREAM_K, 1),  # narrow N: one tile column, nothing to swizzle
)
BY_NAME = {c.name: c for c in SM90_CONFIGS}


@dataclass(frozen=True)
class ShapeTiming(Record):
    """One benchmark shape's median seconds per GEMM for each configuration (by KernelConfig.name)."""

    shape: str
    mnk: list[int]
    seconds: dict[str, float]


@dataclass(frozen=True)
class ShapeChoice:
    config: KernelConfig
    reason: str


def heuristic(m: int, n: int, k: int, sm_count: int) -> ShapeChoice:
    """The module docstring's rules, for a shape no GPU check has measured."""
    tiles = -(-m // TILE) * -(-n // TILE)
    swizzle = SWIZZLE if (m + n) * k > L2_BYTES else 1
    operands = f"A and B {(m + n) * k / 2**20:.0f} MiB {'>' if swizzle > 1 else '<='} L2 {L2_BYTES >> 20} MiB"
    if tiles < sm_count and k > TILE:
        schedule, why = Schedule.STREAM_K, f"{tiles} tiles of {TILE}x{TILE} < {sm_count} SMs: K split across CTAs"
        swizzle, operands = 1, "swizzle 1: every tile is in the one wave"
    elif k <= PINGPONG_MAX_K:
        schedule, why = Schedule.PINGPONG, f"K {k} <= {PINGPONG_MAX_K}: epilogues overlapped with the mainloop"
    else:
        schedule, why = Schedule.COOPERATIVE, f"{tiles} tiles, K {k} > {PINGPONG_MAX_K}"
    config = KernelConfig(schedule, swizzle)
    return ShapeChoice(config, f"{config.name}: heuristic, not yet measured ({why}; {operands})")


def measured(m: int, n: int, k: int, timings: list[ShapeTiming], device: str) -> ShapeChoice | None:
    """The fastest configuration a GPU check measured at exactly (M, N, K) on `device`, or None."""
    timing = next((t for t in timings if t.mnk == [m, n, k]), None)
    known = {name: s for name, s in (timing.seconds if timing else {}).items() if name in BY_NAME}
    if not known:
        return None
    ranked = sorted(known, key=known.__getitem__)
    runner_up = f", next {ranked[1]} {known[ranked[1]] * 1e3:.3f} ms" if len(ranked) > 1 else ""
    fact = f"{known[ranked[0]] * 1e3:.3f} ms{runner_up} ({timing.shape} on {device})"
    return ShapeChoice(BY_NAME[ranked[0]], f"{ranked[0]}: measured fastest of {len(known)}, {fact}")


class ShapeDispatch:
    """The configuration per (M, N, K) for one device, chosen once per shape and remembered with its reason."""

    def __init__(self, sm_count: int, timings: list[ShapeTiming], device: str):
        self.sm_count, self.timings, self.device = sm_count, timings, device
        self.chosen: dict[tuple[int, int, int], ShapeChoice] = {}

    def config(self, m: int, n: int, k: int) -> KernelConfig:
        if (m, n, k) not in self.chosen:
            choice = measured(m, n, k, self.timings, self.device)
            self.chosen[(m, n, k)] = choice or heuristic(m, n, k, self.sm_count)
        return self.chosen[(m, n, k)].config

    def choices(self) -> dict[str, str]:
        """{"MxNxK": "config: why"} for every shape run so far."""
        return {"x".join(map(str, mnk)): c.reason for mnk, c in self.chosen.items()}
