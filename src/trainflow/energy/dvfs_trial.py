"""The seed's data-loading downclock tried on this node's GPU 0: its clocks locked below 500 MHz through NVML, then
at the top clock, then reset to the driver's own; whether the driver allows it, and the power drawn at each clock over
the same fixed matmul loop.

    python -m trainflow.energy.dvfs_trial     # one JSON line (DvfsTrial); scripts/gpu_check.sh's dvfs step

The seed (DESIGN.md, Energy) lowers clocks below 500 MHz while data loads and restores them for compute, saving about
8 %; trainflow's controller (energy.control) does it during training where the driver permits. This trial measures
what the policy rests on, on one GPU: at each clock (the highest supported graphics clock under IDLE_BELOW_MHZ, the
highest supported one, and the driver's own after the reset) the same loop of bf16 matmuls runs while a thread reads
NVML's power every SAMPLE_S; each point records the SM clock NVML saw, the loop's seconds, the mean power and the
energy counter's difference. `allowed` is whether nvmlDeviceSetGpuLockedClocks succeeded (it needs root, and some
clouds and containers refuse it); refused, the loop still runs once at the driver's clocks, so the point is
recorded beside the refusal. The clocks are reset whatever happens.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainflow.energy.nvml import NodeGpus
from trainflow.records import Record

IDLE_BELOW_MHZ = 500  # the seed's "below 500 MHz"
SAMPLE_S = 0.05
MATMULS = 400  # bf16 4096^3 each: ~0.1 s at the top clock on an H100/H200, ~0.5 s under 500 MHz (not yet measured)
SIDE = 4096


@dataclass(frozen=True)
class ClockPoint(Record):
    locked_mhz: int | None
    """The clock locked for the loop; None: the driver's own (no lock, or after the reset)."""
    sm_mhz: float
    """The SM clock NVML read during the loop (the lock's effect, or the driver's choice)."""
    seconds: float
    power_w: float
    """The mean of NVML's power readings during the loop."""
    energy_j: float | None
    """The energy counter's difference over the loop; None where the GPU has no counter."""


@dataclass(frozen=True)
class DvfsTrial(Record):
    device: str
    allowed: bool
    """Whether the driver locked the clocks (nvmlDeviceSetGpuLockedClocks)."""
    refused: str | None
    """Why not, in NVML's words; None where allowed."""
    supported_mhz: list[int]
    """The GPU's supported graphics clocks at its top memory clock, highest first."""
    points: list[ClockPoint]
    reset: bool
    """Whether nvmlDeviceResetGpuLockedClocks ran without error at the end."""


def measure(gpus: NodeGpus, locked_mhz: int | None, loop: Callable[[], None]) -> ClockPoint:
    """Run `loop` once (it returns when its work is done) while a thread samples power and the SM clock."""
    power, clocks, done = [], [], threading.Event()

    def sample() -> None:
        while not done.is_set():
            power.append(gpus.power_w()[0])
            clocks.append(gpus.sm_clock_mhz(0))
            done.wait(SAMPLE_S)

    before, start = gpus.energy_j(), time.perf_counter()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        loop()
    finally:
        done.set()
        sampler.join()
    seconds, after = time.perf_counter() - start, gpus.energy_j()
    energy = after[0] - before[0] if before is not None and after is not None else None
    mean = sum(clocks) / len(clocks), sum(power) / len(power)
    return ClockPoint(locked_mhz, round(mean[0], 1), round(seconds, 4), round(mean[1], 1), energy)


def trial(gpus: NodeGpus, device: str, loop: Callable[[], None]) -> DvfsTrial:
    """The module docstring's trial on `gpus`' first GPU, `loop` being the fixed work at each clock."""
    points, refused = [], None
    try:
        supported = gpus.supported_graphics_mhz(0)
    except gpus.nvml.NVMLError as err:
        supported, refused = [], f"nvmlDeviceGetSupportedGraphicsClocks refused: {err}"
    low = next((mhz for mhz in supported if mhz < IDLE_BELOW_MHZ), min(supported, default=0))
    try:
        for mhz in (low, supported[0]) if supported else ():
            try:
                gpus.lock_clocks_mhz(0, mhz)
            except gpus.nvml.NVMLError as err:
                refused = f"nvmlDeviceSetGpuLockedClocks({mhz} MHz) refused: {err}"
                break
            points.append(measure(gpus, mhz, loop))
    finally:
        try:
            gpus.reset_clocks(0)
            reset = True
        except gpus.nvml.NVMLError:
            reset = False
    points.append(measure(gpus, None, loop))
    return DvfsTrial(device, refused is None, refused, supported, points, reset)


def matmul_loop() -> Callable[[], None]:
    """MATMULS bf16 SIDE^3 matmuls on the current CUDA device, synchronised at the end."""
    import torch

    a = torch.randn(SIDE, SIDE, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(SIDE, SIDE, device="cuda", dtype=torch.bfloat16)

    def loop() -> None:
        for _ in range(MATMULS):
            a @ b
        torch.cuda.synchronize()

    loop()  # warm-up: cuBLAS's handle and heuristics, outside the timed points
    return loop


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("dvfs_trial: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU node")
        return 1
    gpus, why = NodeGpus.open()
    if gpus is None:
        print(f"dvfs_trial: {why}", file=sys.stderr)
        return 1
    try:
        result = trial(gpus, torch.cuda.get_device_name(), matmul_loop())
    finally:
        gpus.close()
    print(json.dumps(result.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
