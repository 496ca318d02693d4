"""trainflow.energy.dvfs_trial on a fake NVML: the clocks locked below 500 MHz and at the top, then reset, a point
measured at each; a driver that refuses the lock is recorded with its words, the loop still measured at its own
clocks, and the reset runs either way (scripts/gpu_check.sh's dvfs step; its stand-in runs the allowed path too).

    .venv/bin/python -m pytest tests/unit/test_dvfs_trial.py -q
"""

from __future__ import annotations

import pytest

from trainflow.energy.dvfs_trial import DvfsTrial, trial
from trainflow.energy.nvml import NodeGpus


class FakeNvml:
    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self, refuse: bool) -> None:
        self.refuse, self.locked, self.calls, self.energy_mj = refuse, None, [], 0.0

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy_mj += 1000.0 * self.nvmlDeviceGetPowerUsage(h) / 1e3  # 1 J of the current power per read
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, h):
        return 100_000 + 250 * (self.locked or 1755)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self.locked or 1755

    def nvmlDeviceGetSupportedMemoryClocks(self, h):
        return [4800, 1593]

    def nvmlDeviceGetSupportedGraphicsClocks(self, h, memory):
        return [1980, 1500, 990, 495, 345] if memory == 4800 else [600]

    def nvmlDeviceSetGpuLockedClocks(self, h, low, high):
        self.calls.append(("lock", low, high))
        if self.refuse:
            raise self.NVMLError("Insufficient Permissions")
        self.locked = low

    def nvmlDeviceResetGpuLockedClocks(self, h):
        self.calls.append(("reset",))
        self.locked = None


@pytest.mark.parametrize("refuse", [False, True])
def test_the_trial_locks_measures_and_resets(refuse):
    nvml = FakeNvml(refuse)
    result = trial(NodeGpus(nvml, [0]), "fake GPU", loop=lambda: sum(range(10_000)))
    assert isinstance(DvfsTrial.from_json(result.to_json()), DvfsTrial) and result.supported_mhz[0] == 1980
    assert nvml.calls[-1] == ("reset",) and result.reset and nvml.locked is None, nvml.calls
    if refuse:
        assert not result.allowed and result.refused.endswith("(495 MHz) refused: Insufficient Permissions")
        assert [p.locked_mhz for p in result.points] == [None] and result.points[0].sm_mhz == 1755
        return
    assert result.allowed and result.refused is None
    assert [(p.locked_mhz, p.sm_mhz) for p in result.points] == [(495, 495), (1980, 1980), (None, 1755)]
    low, top, _ = result.points
    assert low.power_w < top.power_w and low.energy_j < top.energy_j, result.points
