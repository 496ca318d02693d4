"""The energy settings (cfg.energy): the facility's PUE and grid, the stated power models where no meter reads, and
the GPU power cap and DVFS policy; trainflow.energy measures and applies them.

    python -c "from trainflow.config import compose; print(compose('account_energy', ['energy=cscs']).energy)"
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from trainflow.config.domain import checked


@dataclass
class EnergyConfig:
    pue: float = checked(ge=1)
    """Facility energy / IT energy (seed: 1.05 with lake cooling)."""
    grid_gco2_per_kwh: float = checked(ge=0)
    """Carbon intensity of the supply (hydro-dominated grid)."""
    cpu_watts_per_core: float = checked(12.0, ge=0)
    """Stated model for CPU energy when RAPL is not readable: watts per busy core."""
    gpu_watts: float = checked(560.0, ge=0)
    """Stated model for GPU energy when NVML has no energy counter (seed: 560 W with vBoost)."""
    dvfs: bool = MISSING
    """Lower clocks while data loads, restore them for compute (seed: saves ~8 %)."""
    idle_clock_mhz: int = checked(500, gt=0)
    """GPU clock while data loads under DVFS (seed: below 500 MHz); must not exceed compute_clock_mhz."""
    compute_clock_mhz: int = checked(1980, gt=0)
    """GPU clock for compute under DVFS (GH200's maximum; the seed's vBoost runs at 1.8 GHz)."""
    dvfs_min_phase_s: float = checked(0.01, ge=0)
    """DVFS lowers clocks for a data phase only when the one before it lasted this long: a clock change takes
    the driver milliseconds."""
    power_cap_w: float = checked(ge=0)
    """Power limit set on every GPU through NVML for training (seed: 660 W); 0 keeps the driver's limit. Must lie in
    the range NVML reports for the device."""
    sample_period_s: float = checked(gt=0)
    """How often each node's sampler reads its power counters during training (the report's power plot)."""
