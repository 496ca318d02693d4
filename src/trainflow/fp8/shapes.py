"""Which configuration of the Hopper kernel (kernels/fp8_gemm_sm90.cu) runs each GEMM shape, and why.

    python -c "from trainflow.fp8.shapes import heuristic; print(heuristic(8192, 128, 8192, sm_count=132).reason)"

The kernel holds three schedules (fp8_gemm.h's Fp8GemmSchedule) and takes the tile scheduler's raster swizzle at
run time; SM90_CONFIGS are the pairs the GPU check measures on every benchmark shape (ShapeTiming, beside
torch._scaled_mm's time). trainflow.fp8.dispatch picks per (M, N, K) from those measurements; where there are none,
the heuristic below, its reason saying "not yet measured". With 128x128 tiles and `sm_count` SMs:
  fewer tiles than SMs (the 70B's N = 128 per tp8 rank: 64 tiles on 132 SMs) leaves SMs idle unless K is split:
  stream-K. K of at most PINGPONG_MAX_K leaves a tile few k-tiles, so its epilogue is a large share of its time:
  ping-pong overlaps it with the other warpgroup's mainloop. Otherwise cooperative (the promotion's waits are
  covered by the other warpgroup on the same tile). Operands larger than L2 (A's and B's bytes over L2_BYTES)
  take swizzle 8, so a wave of CTAs walks 8-tile bands and reuses what it loaded; smaller ones swizzle 1.
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
    """One benchmark shape's median seconds per GEMM for each configuration (by KernelConfig.name) and for
    torch._scaled_mm (SCALED_MM)."""

    shape: str
    mnk: list[int]
    seconds: dict[str, float]


SCALED_MM = "scaled_mm"
"""torch._scaled_mm's name beside the configurations' in a ShapeTiming's seconds (trainflow.fp8.dispatch)."""


@dataclass(frozen=True)
class ShapeChoice:
    runner: str
    """A configuration's name (KernelConfig.name) or SCALED_MM."""
    reason: str

    @property
    def config(self) -> KernelConfig | None:
        """The kernel's configuration to run; None where torch._scaled_mm runs."""
        return BY_NAME.get(self.runner)


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
    name = KernelConfig(schedule, swizzle).name
    return ShapeChoice(name, f"{name}: heuristic, not yet measured ({why}; {operands})")
