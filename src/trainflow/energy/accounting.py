"""Energy accounting: measured counters where present, a stated power x time model where not.

    stage_energy(read_record(JobMetrics, "runs/default/metrics/prepare_data.json"), energy=cfg.energy, gpus=0)

Per stage, IT energy = GPU (NVML counters of the nodes, else gpus x energy.gpu_watts x time) + CPU (RAPL,
else CPU-seconds x energy.cpu_watts_per_core). A training segment's counters come from its nodes' windows
(node.py: each node once, never each rank). Facility energy = IT x PUE; carbon = facility kWh x grid
intensity. The DVFS policy (dvfs.py) is applied through NVML where permitted; its saving is always an
estimate from the measured phase times, since the run at full clocks did not happen.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainflow.config import EnergyConfig
from trainflow.energy.dvfs import SaveMarks, StepMarks, dvfs_clocks, dvfs_saving_j, lowered_s, phase_trace
from trainflow.energy.metrics import JobMetrics
from trainflow.energy.report import DvfsOutcome, Facility, StageEnergy

J_PER_KWH = 3.6e6


def stage_energy(metrics: JobMetrics, *, energy: EnergyConfig, gpus: int) -> StageEnergy:
    """IT energy of one job from its metrics file, with the source of each part."""
    counters = metrics.nodes if metrics.nodes and metrics.nodes.nodes else metrics  # a segment: its nodes' windows
    cpu_s = metrics.cpu_s + metrics.rank_cpu_s
    if counters.rapl_j is not None:
        cpu_j, cpu_source = counters.rapl_j, "rapl"
    else:
        cpu_j = cpu_s * energy.cpu_watts_per_core
        cpu_source = f"model: {cpu_s:.1f} CPU-s x {energy.cpu_watts_per_core:g} W"
    if counters.gpu_j is not None:
        gpu_j, gpu_source = counters.gpu_j, "nvml"
    elif gpus:
        gpu_j, gpu_source = gpus * energy.gpu_watts * metrics.wall_s, f"model: {gpus} GPUs x {energy.gpu_watts:g} W"
    else:
        gpu_j, gpu_source = 0.0, "no GPUs"
    return StageEnergy(
        stage=metrics.stage,
        segment=metrics.segment,
        job=metrics.job,
        wall_s=metrics.wall_s,
        cpu_s=cpu_s,
        cpu_j=cpu_j,
        cpu_source=cpu_source,
        gpu_j=gpu_j,
        gpu_source=gpu_source,
        it_j=cpu_j + gpu_j,
    )


def facility(it_j: float, energy: EnergyConfig) -> Facility:
    facility_j = it_j * energy.pue
    kwh = facility_j / J_PER_KWH
    return Facility(it_j=it_j, facility_j=facility_j, facility_kwh=kwh, co2_g=kwh * energy.grid_gco2_per_kwh)


def dvfs_outcome(
    segments: Sequence[tuple[Sequence[StepMarks], Sequence[SaveMarks]]],
    *,
    energy: EnergyConfig,
    gpus: int,
    applied: bool,
    basis: str,
) -> DvfsOutcome:
    """The DVFS policy replayed on the segments' recorded phases (their steps and saves): seconds it ran (or would
    have run) at the idle clock and the estimated saving on `gpus` GPUs at energy.gpu_watts."""
    trace = [phase for steps, saves in segments for phase in phase_trace(steps, saves)]
    clocks = dvfs_clocks(
        trace, idle_mhz=energy.idle_clock_mhz, compute_mhz=energy.compute_clock_mhz, min_phase_s=energy.dvfs_min_phase_s
    )
    seconds = lowered_s(trace, clocks, compute_mhz=energy.compute_clock_mhz) if energy.dvfs else 0.0
    return DvfsOutcome(
        enabled=energy.dvfs,
        applied=applied,
        data_loading_s=sum(p.seconds for p in trace if p.kind == "data"),
        lowered_s=seconds,
        lowered_phases=sum(mhz < energy.compute_clock_mhz for mhz in clocks) if energy.dvfs else 0,
        idle_clock_mhz=energy.idle_clock_mhz,
        compute_clock_mhz=energy.compute_clock_mhz,
        gpus=gpus,
        estimated_saving_j=dvfs_saving_j(seconds, gpus=gpus, gpu_watts=energy.gpu_watts),
        basis=basis,
    )


def campaign_gwh(*, gpus: int, watts: float, hours: float, pue: float = 1.0) -> float:
    """The seed's sizing: GPUs x power x time (4096 x 560 W x 2160 h = 4.95 GWh before PUE)."""
    return gpus * watts * hours * pue / 1e9
