"""A stand-in for one of scripts/gpu_check.sh's GPU steps (its --stand-in mode), of the same shape as the step: the
same kind of output on stdout, the files the step leaves, its exit status; so the runner, the budgets, the merge into
gpu_check.json and the evidence kept are tested for real on a machine without a GPU (tests/unit/test_gpu_check.py).

    python scripts/gpu_check_steps/stand_in.py STEP THE STEP'S OWN COMMAND...

What is real in each: tests_gpu runs pytest with the step's own flags on stand_in_tests.py (one test passes, one
fails with output to keep); power and dvfs run the step's own code (power.py, trainflow.energy.dvfs_trial) on a fake
NVML (FakeNvml below) and, for dvfs, a CPU matmul loop; fp8_gemm prints the committed H200 record under a stand-in
device name, which the merge writes into measured.json; build leaves a build folder in the kept cache
($TRAINFLOW_KERNEL_CACHE), which a later --steps run finds. $GPU_CHECK_STAND_IN makes steps misbehave, e.g.
"fp8_gemm=fail,power=hang": fail exits 1 after a line on stderr, hang sleeps past any budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Imports of trainflow stay inside the steps that run its code: importing torch takes seconds on a 2-core machine.
DEVICE = "stand-in (no GPU)"
HERE = Path(__file__).resolve().parent
KERNELS = HERE.parents[1] / "kernels"


class FakeNvml:
    """The pynvml functions the power and dvfs steps call, for one GPU whose power follows its locked clock."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self, refuse_clocks: bool = False) -> None:
        self.limit_mw, self.locked, self.refuse_clocks = 700_000, None, refuse_clocks
        self.started = time.monotonic()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> float:
        return (time.monotonic() - self.started) * self.nvmlDeviceGetPowerUsage(h)  # mJ at the current power

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 100_000 + 250 * self.nvmlDeviceGetClockInfo(h, self.NVML_CLOCK_SM)  # mW: 100 W + 0.25 W per MHz

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return self.locked or 1755

    def nvmlDeviceGetSupportedMemoryClocks(self, h: int) -> list[int]:
        return [4800, 1593]

    def nvmlDeviceGetSupportedGraphicsClocks(self, h: int, memory: int) -> list[int]:
        return list(range(345, 1981, 15))

    def nvmlDeviceSetGpuLockedClocks(self, h: int, low: int, high: int) -> None:
        if self.refuse_clocks:
            raise self.NVMLError("Insufficient Permissions")
        self.locked = low

    def nvmlDeviceResetGpuLockedClocks(self, h: int) -> None:
        self.locked = None

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return self.limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: int) -> tuple[int, int]:
        return 200_000, 700_000

    def nvmlDeviceSetPowerManagementLimit(self, h: int, mw: int) -> None:
        self.limit_mw = mw


def cpu_loop() -> None:
    """A fixed loop of work on the CPU, a few milliseconds long (no torch: a stand-in starts in a fraction of a s)."""
    sum(i * i for i in range(100_000))


def build(cache: Path) -> None:
    folder = cache / "trainflow_fp8_sm90-standin"
    if (folder / "trainflow_fp8_sm90.so").is_file():
        print(f"{folder / 'trainflow_fp8_sm90.so'}: fp8_gemm_sm90.cu for stand-in, cached: built earlier")
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainflow_fp8_sm90.so").write_bytes(b"")
    print(f"{folder / 'trainflow_fp8_sm90.so'}: fp8_gemm_sm90.cu for stand-in, built in 0.0 s")


def main(step: str, command: list[str]) -> int:
    behaviour = dict(b.split("=") for b in os.environ.get("GPU_CHECK_STAND_IN", "").split(",") if b)
    if behaviour.get(step) == "hang":
        time.sleep(3600)
    if behaviour.get(step) == "fail":
        print(f"stand-in {step}: failing as GPU_CHECK_STAND_IN asked", file=sys.stderr)
        return 1
    if step == "tests_gpu":  # the step's own pytest command, on the stand-in tests
        tests = str(HERE / "stand_in_tests.py")
        return subprocess.run([tests if arg == "tests/gpu" else arg for arg in command]).returncode
    if step == "build":
        build(Path(os.environ["TRAINFLOW_KERNEL_CACHE"]))
    elif step == "sass":
        library = Path(command[-1])
        print(json.dumps({"arch": command[-2], "library": str(library), "found": library.is_file(), "faults": []}))
        return 0 if library.is_file() else 1
    elif step == "fp8_gemm":
        record = json.loads((KERNELS / "measured.json").read_text())["sm90"][0] | {"device": DEVICE}
        print(json.dumps({"benchmark": "fp8_gemm", "device": DEVICE, "measured": {"sm90": record}}))
    elif step == "power":
        from power import check  # the step's own code, beside this file

        from trainflow.energy.nvml import NodeGpus

        found, held = check(NodeGpus(FakeNvml(), [0]))
        print(json.dumps(found))
        return 0 if held else 1
    elif step == "dvfs":
        from trainflow.energy.dvfs_trial import trial
        from trainflow.energy.nvml import NodeGpus

        result = trial(NodeGpus(FakeNvml(refuse_clocks=behaviour.get(step) == "refuse"), [0]), DEVICE, cpu_loop)
        print(json.dumps(result.to_json()))
    else:  # environment, train_steps: the keys the real step prints
        print(json.dumps({"stand_in": step, "device": DEVICE, "command": command}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
