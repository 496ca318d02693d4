"""This node's GPUs through NVML (nvidia-ml-py): energy and power counters, power limits, locked clocks.

    gpus, why_not = NodeGpus.open()   # None and the reason on a machine without a driver

Opened by one process per node (the local rank 0, see node.py), so every GPU is read once. NVML
reports millijoules, milliwatts and megahertz; this module speaks joules, watts and megahertz.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class NodeGpus:
    nvml: Any
    """The pynvml module, initialised (tests pass a fake with the same functions)."""
    handles: list

    @classmethod
    def open(cls) -> tuple[NodeGpus | None, str]:
        """The node's GPUs, or None and why NVML could not start (no library, no driver, no GPU)."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as err:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            return None, f"NVML unavailable ({type(err).__name__}: {err})"
        count = pynvml.nvmlDeviceGetCount()
        if not count:
            pynvml.nvmlShutdown()
            return None, "NVML found no GPU on this node"
        return cls(pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]), ""

    def close(self) -> None:
        self.nvml.nvmlShutdown()

    def faults(self) -> list[str]:
        """Each device fault NVML reports on this node's GPUs, one clause each: uncorrected ECC errors since the driver
        loaded, a row remapping that failed or waits for a reset, a GPU lost (it fell off the bus). A query a GPU does
        not support (no ECC, no row remapper before Ampere) reports nothing."""
        found = []
        for i, handle in enumerate(self.handles):
            try:
                nvml = self.nvml
                ecc = nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
                found += [f"GPU {i}: {ecc} uncorrected ECC errors since the driver loaded"] if ecc else []
                _, uncorrected, pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
                if failed or (pending and uncorrected):
                    found.append(f"GPU {i}: row remapping {'failed' if failed else 'pending a reset'}")
            except self.nvml.NVMLError_GpuIsLost:
                found.append(f"GPU {i}: lost (NVML_ERROR_GPU_IS_LOST)")
            except self.nvml.NVMLError:  # not supported on this GPU
                continue
        return found

    def energy_j(self) -> list[float] | None:
        """Each GPU's energy since the driver loaded; None where a GPU has no counter (before Volta)."""
        try:
            return [self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3 for h in self.handles]
        except self.nvml.NVMLError:
            return None

    def slowdowns(self) -> list[int]:
        """Each GPU's active hardware or thermal clock slowdowns (NVML throttle-reason bits; 0: none)."""
        bits = (
            self.nvml.nvmlClocksThrottleReasonHwSlowdown
            | self.nvml.nvmlClocksThrottleReasonSwThermalSlowdown
            | self.nvml.nvmlClocksThrottleReasonHwThermalSlowdown
            | self.nvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
        )
        return [self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) & bits for h in self.handles]

    def busy_pct(self) -> list[float]:
        """Each GPU's utilisation: the share of the driver's last sample period in which a kernel ran (percent)."""
        return [float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.handles]

    def power_w(self) -> list[float]:
        return [self.nvml.nvmlDeviceGetPowerUsage(h) / 1e3 for h in self.handles]

    def power_limit_w(self, i: int) -> float:
        return self.nvml.nvmlDeviceGetPowerManagementLimit(self.handles[i]) / 1e3

    def power_limit_range_w(self, i: int) -> tuple[float, float]:
        low, high = self.nvml.nvmlDeviceGetPowerManagementLimitConstraints(self.handles[i])
        return low / 1e3, high / 1e3

    def set_power_limit_w(self, i: int, watts: float) -> None:
        self.nvml.nvmlDeviceSetPowerManagementLimit(self.handles[i], round(watts * 1e3))

    def lock_clocks_mhz(self, i: int, mhz: int) -> None:
        self.nvml.nvmlDeviceSetGpuLockedClocks(self.handles[i], mhz, mhz)

    def reset_clocks(self, i: int) -> None:
        self.nvml.nvmlDeviceResetGpuLockedClocks(self.handles[i])

    def sm_clock_mhz(self, i: int) -> int:
        return self.nvml.nvmlDeviceGetClockInfo(self.handles[i], self.nvml.NVML_CLOCK_SM)

    def supported_graphics_mhz(self, i: int) -> list[int]:
        """The graphics clocks GPU i can be locked at (with its top memory clock), highest first."""
        memory = max(self.nvml.nvmlDeviceGetSupportedMemoryClocks(self.handles[i]))
        return sorted(self.nvml.nvmlDeviceGetSupportedGraphicsClocks(self.handles[i], memory), reverse=True)
