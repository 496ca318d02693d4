"""Energy accounting: measured counters where present, a stated power x time model where not.

Per stage, IT energy = GPU (NVML counter, else gpus x energy.gpu_watts x time) + CPU (RAPL, else
CPU-seconds x energy.cpu_watts_per_core). Facility energy = IT x PUE; carbon = facility kWh x grid
intensity. The DVFS policy (seed: clocks below 500 MHz while data loads, restored for compute,
~8 % saved) is applied through NVML where permitted; elsewhere it is recorded as what it would
have done, with its saving estimated from the measured data-loading time.
"""

from __future__ import annotations

from trainflow.config import EnergyConfig

J_PER_KWH = 3.6e6
# Dynamic power scales roughly with f * V^2; at 500 MHz of 1980 the board draws about this share
# of its compute power (stated assumption, used only for the estimate).
IDLE_CLOCK_POWER_SHARE = 0.45


def stage_energy(metrics: dict, *, energy: EnergyConfig, gpus: int) -> dict:
    """IT energy of one stage from its metrics file, with the source of each part."""
    cpu_s = metrics["cpu_s"] + metrics.get("rank_cpu_s", 0.0)
    if metrics.get("rapl_j") is not None:
        cpu_j, cpu_source = metrics["rapl_j"], "rapl"
    else:
        cpu_j, cpu_source = (
            cpu_s * energy.cpu_watts_per_core,
            f"model: {cpu_s:.1f} CPU-s x {energy.cpu_watts_per_core} W",
        )
    gpu_measured = metrics.get("rank_gpu_j") or metrics.get("gpu_j")
    if gpu_measured is not None:
        gpu_j, gpu_source = gpu_measured, "nvml"
    elif gpus:
        gpu_j, gpu_source = gpus * energy.gpu_watts * metrics["wall_s"], f"model: {gpus} GPUs x {energy.gpu_watts} W"
    else:
        gpu_j, gpu_source = 0.0, "no GPUs"
    return {
        "stage": metrics["stage"],
        "segment": metrics.get("segment"),
        "wall_s": metrics["wall_s"],
        "cpu_s": cpu_s,
        "cpu_j": cpu_j,
        "cpu_source": cpu_source,
        "gpu_j": gpu_j,
        "gpu_source": gpu_source,
        "it_j": cpu_j + gpu_j,
    }


def facility(it_j: float, energy: EnergyConfig) -> dict:
    facility_j = it_j * energy.pue
    kwh = facility_j / J_PER_KWH
    return {"it_j": it_j, "facility_j": facility_j, "facility_kwh": kwh, "co2_g": kwh * energy.grid_gco2_per_kwh}


def dvfs_estimate(data_s: float, *, gpus: int, energy: EnergyConfig, applied: bool) -> dict:
    """What lowering clocks during data loading saves: data time x GPUs x (1 - idle power share) x power."""
    saved_j = data_s * gpus * energy.gpu_watts * (1 - IDLE_CLOCK_POWER_SHARE) if energy.dvfs else 0.0
    return {
        "enabled": energy.dvfs,
        "applied": applied,
        "data_loading_s": data_s,
        "idle_clock_mhz": energy.idle_clock_mhz,
        "compute_clock_mhz": energy.compute_clock_mhz,
        "estimated_saving_j": saved_j,
        "note": "applied through NVML" if applied else "recorded, not applied: NVML clock control unavailable here",
    }


def campaign_gwh(*, gpus: int, watts: float, hours: float, pue: float = 1.0) -> float:
    """The seed's sizing: GPUs x power x time (4096 x 560 W x 2160 h = 4.95 GWh before PUE)."""
    return gpus * watts * hours * pue / 1e9
