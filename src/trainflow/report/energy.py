"""The report's energy section: per stage, per training segment and phase, per node, Slurm's counter, the power cap
and DVFS, from energy.json (trainflow.energy.report).

    lines = energy_section(read_record(EnergyReport, path), cfg, plots, here)
"""

from __future__ import annotations

from pathlib import Path

from trainflow.config import TrainflowConfig
from trainflow.energy.phases import power_series, trace_host
from trainflow.energy.report import EnergyReport
from trainflow.report.sections import relative, table


def joules(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def energy_section(energy: EnergyReport, cfg: TrainflowConfig, power_plot: str, here: Path) -> list[str]:
    """Energy per stage, per segment and phase, facility energy and carbon, Slurm's counter, DVFS and the cap."""
    stages = [[s.label, f"{s.wall_s:.1f}", f"{s.it_j:.1f}", s.cpu_source, s.gpu_source] for s in energy.stages]
    phases = [
        [
            seg.segment,
            p.phase,
            f"{p.seconds:.2f}",
            f"{p.it_j:.1f}",
            f"{p.it_j / seg.it_j:.1%}" if seg.it_j else "-",
            p.cpu_source,
            p.gpu_source,
        ]
        for seg in energy.segments
        for p in seg.phases
    ]
    slurm = [
        [s.stage, s.job_id, s.status, joules(s.consumed_j), f"{s.meter_j:.1f}", joules(s.difference_j)]
        for s in energy.slurm
    ]
    power = power_rows(energy, cfg.energy.cpu_watts_per_core)
    return [
        "## Energy",
        "",
        "Sources: `nvml` and `rapl` are counters read once per node (by its local rank 0), `slurm` is Slurm's "
        "accounting, `model: ...` is an estimate from the stated power x time model of `conf/energy/`.",
        "",
        table(stages, ["stage", "wall s", "IT J", "CPU source", "GPU source"]),
        "",
        "### Training segments by phase",
        "",
        "Phases are the trainer's own markers (rank 0's step records and checkpoint saves); `other` is start-up, "
        "evaluation and waiting.",
        "",
        table(phases, ["segment", "phase", "seconds", "IT J", "share", "CPU source", "GPU source"]),
        "",
        *([table(power, ["segment", "node", "samples", "mean W", "peak W", "source"]), ""] if power else []),
        f"![power]({relative(power_plot, here)})",
        "",
        *totals(energy),
        "",
        "Slurm's ConsumedEnergy beside the meter: " + ("not a Slurm job here (local executor)." if not slurm else ""),
        "",
        *([table(slurm, ["stage", "job", "Slurm", "Slurm J", "meter J", "Slurm - meter J"]), ""] if slurm else []),
        *dvfs_lines(energy, cfg.energy.dvfs_min_phase_s),
        f"[energy.json]({relative(cfg.io.energy_report, here)})",
        "",
    ]


def power_rows(energy: EnergyReport, cpu_watts_per_core: float) -> list[list[object]]:
    """Each node's mean and peak power over a segment, from its power samples."""
    rows = []
    for seg in energy.segments:
        for path in seg.power_traces:
            _, watts, source = power_series(path, cpu_watts_per_core)
            if watts:
                mean, peak = sum(watts) / len(watts), max(watts)
                rows.append([seg.segment, trace_host(path), len(watts) + 1, f"{mean:.1f}", f"{peak:.1f}", source])
    return rows


def totals(energy: EnergyReport) -> list[str]:
    t, total = energy.training, energy.total
    return [
        f"Run total: IT {total.it_j:.1f} J, facility {total.facility_j:.1f} J at PUE {energy.pue}, {total.co2_g:.4f} "
        f"g CO2 at {energy.grid_gco2_per_kwh} g/kWh. Training: {t.it_j:.1f} J IT ({t.facility_j:.1f} J facility), "
        f"{t.tokens} tokens, {t.tokens_per_it_joule or 0:.1f} tokens/J IT ({t.tokens_per_facility_joule or 0:.1f} per "
        f"facility J), {t.device_hours:.4f} {t.device}-hours."
    ]


def dvfs_lines(energy: EnergyReport, min_phase_s: float) -> list[str]:
    d = energy.dvfs
    lowered = (
        f"ran {d.lowered_phases} data phases ({d.lowered_s:.2f} s) at {d.idle_clock_mhz} MHz"
        if d.lowered_phases
        else f"lowered no clock: of {d.data_loading_s:.2f} s of data loading no phase followed one that lasted "
        f"energy.dvfs_min_phase_s = {min_phase_s:g} s (a clock change takes the driver milliseconds)"
    )
    return [
        "Power cap and DVFS: " + ("; ".join(energy.actions) or "none configured") + ".",
        f"DVFS {'applied' if d.applied else 'not applied'}: the policy {lowered}; estimated saving "
        f"{d.estimated_saving_j:.1f} J ({d.basis}).",
    ]
