"""Energy of every stage of the run: measured where the machine exposes counters, modelled where not.

python -m trainflow.stages.account_energy 'io.run_metrics=[runs/default/metrics/prepare_data.json]'

Per stage and per training segment: IT energy with the source of each part (`nvml`, `rapl`, `model: ...`),
inside each segment the split by phase (data loading, compute, checkpoint save, other), Slurm's ConsumedEnergy
beside the meter's figure where accounting measured one, facility energy at PUE, carbon, tokens per joule,
device-hours, and the DVFS / power-cap actions with the estimated saving (trainflow.energy.report).
"""

from __future__ import annotations

import dataclasses

from trainflow.config import ALLOCATING, TrainflowConfig
from trainflow.energy.accounting import dvfs_outcome, facility, stage_energy
from trainflow.energy.metrics import JobMetrics, StageFigures
from trainflow.energy.node import actions_taken
from trainflow.energy.phases import phase_energy
from trainflow.energy.report import EnergyReport, SegmentEnergy, SlurmComparison, StageEnergy, TrainingEnergy
from trainflow.energy.slurm import consumed_energy
from trainflow.records import read_record
from trainflow.stage import StageError, stage_log, stage_main, write_json
from trainflow.train.summary import SegmentSummary

log = stage_log(__file__)


def here_or_model(metrics: JobMetrics, executor: str) -> JobMetrics:
    """A job stage's metrics without node windows (validate_nccl), with the counters of the stage's own process
    dropped where they describe the submitting node rather than the job's (any executor but local)."""
    if metrics.stage in ALLOCATING and metrics.nodes is None and executor != "local":
        return dataclasses.replace(metrics, rapl_j=None, gpu_j=None)
    return metrics


def slurm_comparison(metrics: JobMetrics, row: StageEnergy) -> SlurmComparison:
    """Slurm's ConsumedEnergy of the stage's job beside the meter's IT figure, and their difference."""
    slurm = consumed_energy(metrics.slurm_job_id)
    measured = slurm["consumed_j"]
    difference = None if measured is None else measured - row.it_j
    return SlurmComparison(row.stage, row.segment, slurm["job_id"], slurm["status"], measured, row.it_j, difference)


def run(cfg: TrainflowConfig) -> StageFigures:
    if not cfg.io.run_metrics:
        raise StageError(
            "io.run_metrics is empty: pass the jobs' metrics files, e.g. "
            "'io.run_metrics=[runs/x/metrics/prepare_data.json]'"
        )
    e, a = cfg.energy, cfg.cluster.allocation
    gpus = a.nodes * a.gpus_per_node
    metrics = [read_record(JobMetrics, p) for p in cfg.io.run_metrics]
    stages = [
        stage_energy(here_or_model(m, a.executor), energy=e, gpus=gpus if m.stage in ALLOCATING else 0) for m in metrics
    ]
    # Paired in order: the workflow lists every phase's segments alike in both (a segment number repeats across phases)
    summaries = [read_record(SegmentSummary, p) for p in cfg.io.segment_reports]
    trained = [(m, row) for m, row in zip(metrics, stages) if m.stage == "train_segment"]
    if [m.segment for m, _ in trained] != [s.segment for s in summaries]:
        raise StageError(
            f"io.run_metrics holds train_segment metrics of segments {[m.segment for m, _ in trained]} but "
            f"io.segment_reports summaries of {[s.segment for s in summaries]}: pass each segment's metrics-<i>.json "
            "in the order of its summary"
        )
    segments = [
        SegmentEnergy(
            segment=row.segment,
            it_j=row.it_j,
            nodes=len(m.node_windows),
            power_traces=[w.trace for w in m.node_windows],
            phases=phase_energy(summary.steps, summary.saves, m.node_windows, row),
        )
        for (m, row), summary in zip(trained, summaries)
    ]
    report = energy_report(cfg, metrics, stages, trained, segments, summaries, gpus=gpus)
    write_json(cfg.io.energy_report, report.to_json())
    log_report(report)
    return StageFigures()


def energy_report(cfg, metrics, stages, trained, segments, summaries, *, gpus: int) -> EnergyReport:
    """The run's energy from its jobs' rows: totals, training's tokens per joule, DVFS, Slurm's counters."""
    e = cfg.energy
    windows = [w for m, _ in trained for w in m.node_windows]
    tokens = sum(m.tokens for m, _ in trained)
    train_j = sum(row.it_j for _, row in trained)
    train_s = sum(row.wall_s for _, row in trained)
    devices = gpus or cfg.parallel.world_size
    basis = (
        f"estimate: {devices} GPUs at energy.gpu_watts={e.gpu_watts:g} W"
        if gpus
        else f"estimate had each of the {devices} CPU ranks driven a GPU at energy.gpu_watts={e.gpu_watts:g} W"
    )
    applied = any(w.dvfs_applied for w in windows)
    marks = [(s.steps, s.saves) for s in summaries]
    training = facility(train_j, e)
    return EnergyReport(
        stages=stages,
        segments=segments,
        total=facility(sum(s.it_j for s in stages), e),
        training=TrainingEnergy(
            it_j=train_j,
            facility_j=training.facility_j,
            tokens=tokens,
            tokens_per_it_joule=tokens / train_j if train_j else None,
            tokens_per_facility_joule=tokens / training.facility_j if train_j else None,
            device_hours=devices * train_s / 3600,
            device="GPU" if gpus else "CPU rank",
        ),
        pue=e.pue,
        grid_gco2_per_kwh=e.grid_gco2_per_kwh,
        actions=actions_taken(windows),
        dvfs=dvfs_outcome(marks, energy=e, gpus=devices, applied=applied, basis=basis),
        slurm=[slurm_comparison(m, row) for m, row in zip(metrics, stages) if m.slurm_job_id],
    )


def log_report(report: EnergyReport) -> None:
    for s in report.stages:
        log.info("Accounted %-18s %8.1f J IT (CPU %s; GPU %s)", s.label, s.it_j, s.cpu_source, s.gpu_source)
    for seg in report.segments:
        for p in seg.phases:
            log.info(
                "Accounted segment %s phase %-10s %7.2f s %8.1f J IT (CPU %s; GPU %s)",
                *(seg.segment, p.phase, p.seconds, p.it_j, p.cpu_source, p.gpu_source),
            )
    for s in report.slurm:
        log.info("Slurm job %s (%s): %s", s.job_id, s.stage, s.status)
    t, d = report.training, report.dvfs
    log.info(
        "Accounted %.1f J IT, %.1f J facility (PUE %.2f), %.4f g CO2; training %.1f tokens/J IT; DVFS %s, "
        "estimated saving %.1f J (%s)",
        *(report.total.it_j, report.total.facility_j, report.pue, report.total.co2_g, t.tokens_per_it_joule or 0),
        *("applied" if d.applied else "not applied", d.estimated_saving_j, d.basis),
    )


if __name__ == "__main__":
    stage_main(run, config_name="account_energy")
