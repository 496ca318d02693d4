"""Energy of every stage of the run: measured where the machine exposes counters, modelled where not.

python -m trainflow.stages.account_energy 'io.metrics=[runs/default/metrics/prepare_data.json]'

Per stage and per training segment: IT energy with the source of each part (`nvml`, `rapl`, `model: ...`),
inside each segment the split by phase (data loading, compute, checkpoint save, other), Slurm's ConsumedEnergy
beside the meter's figure where accounting measured one, facility energy at PUE, carbon, tokens per joule,
device-hours, and the DVFS / power-cap actions with the estimated saving.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from trainflow.config import ALLOCATING, CONF_DIR, TrainflowConfig
from trainflow.energy.accounting import dvfs_outcome, facility, stage_energy, stage_label
from trainflow.energy.node import actions_taken
from trainflow.energy.phases import phase_energy
from trainflow.energy.slurm import consumed_energy
from trainflow.stage import StageError, read_json, run_stage, stage_log, write_json

log = stage_log(__file__)


def here_or_model(metrics: dict, executor: str) -> dict:
    """A job stage's metrics without node windows (validate_nccl), with the counters of the stage's own process
    dropped where they describe the submitting node rather than the job's (any executor but local)."""
    if metrics["stage"] in ALLOCATING and "nodes" not in metrics and executor != "local":
        return {**metrics, "rapl_j": None, "gpu_j": None}
    return metrics


def slurm_comparison(metrics: dict, row: dict) -> dict:
    """Slurm's ConsumedEnergy of the stage's job beside the meter's IT figure, and their difference."""
    slurm = consumed_energy(metrics.get("slurm_job_id"))
    measured = slurm["consumed_j"]
    return {
        "stage": row["stage"],
        "segment": row["segment"],
        **slurm,
        "meter_j": row["it_j"],
        "difference_j": None if measured is None else measured - row["it_j"],
    }


def run(cfg: TrainflowConfig) -> dict:
    if not cfg.io.metrics:
        raise StageError(
            "io.metrics is empty: pass the stage metrics files, e.g. 'io.metrics=[runs/x/metrics/prepare_data.json]'"
        )
    e, a = cfg.energy, cfg.cluster.allocation
    gpus = a.nodes * a.gpus_per_node
    metrics = [read_json(p) for p in cfg.io.metrics]
    stages = [
        stage_energy(here_or_model(m, a.executor), energy=e, gpus=gpus if m["stage"] in ALLOCATING else 0)
        for m in metrics
    ]
    summaries = {s["segment"]: s for s in map(read_json, cfg.io.segment_reports)}
    trained = [(m, row) for m, row in zip(metrics, stages) if m["stage"] == "train_segment"]
    missing = sorted(set(summaries) - {m["segment"] for m, _ in trained})
    if missing:
        raise StageError(f"io.metrics holds no train_segment metrics for segments {missing}; pass metrics-<i>.json")
    stale = sorted(i for i, s in summaries.items() if s["steps"] and "started" not in s["steps"][0])
    if stale:
        raise StageError(
            f"the reports of segments {stale} have no phase markers (written by an older trainflow): "
            "rerun training with snakemake --forcerun train_segment"
        )
    windows = [w for m, _ in trained for w in m["node_windows"]]
    segments = [
        {
            "segment": row["segment"],
            "it_j": row["it_j"],
            "nodes": len(m["node_windows"]),
            "power_traces": [w["trace"] for w in m["node_windows"]],
            "phases": phase_energy(summaries[row["segment"]], m["node_windows"], row),
        }
        for m, row in trained
    ]
    tokens = sum(m["tokens"] for m, _ in trained)
    train_j = sum(row["it_j"] for _, row in trained)
    train_s = sum(row["wall_s"] for _, row in trained)
    devices = gpus or cfg.parallel.world_size
    dvfs = dvfs_outcome(
        list(summaries.values()), energy=e, gpus=devices, applied=any(w["dvfs_applied"] for w in windows)
    )
    dvfs["basis"] = (
        f"estimate: {devices} GPUs at energy.gpu_watts={e.gpu_watts:g} W"
        if gpus
        else f"estimate had each of the {devices} CPU ranks driven a GPU at energy.gpu_watts={e.gpu_watts:g} W"
    )
    report = {
        "stages": stages,
        "segments": segments,
        "total": facility(sum(s["it_j"] for s in stages), e),
        "training": {
            **facility(train_j, e),
            "tokens": tokens,
            "tokens_per_it_joule": tokens / train_j if train_j else None,
            "tokens_per_facility_joule": tokens / (train_j * e.pue) if train_j else None,
            "device_hours": devices * train_s / 3600,
            "device": "GPU" if gpus else "CPU rank",
        },
        "pue": e.pue,
        "grid_gco2_per_kwh": e.grid_gco2_per_kwh,
        "actions": actions_taken(windows),
        "dvfs": dvfs,
        "slurm": [slurm_comparison(m, row) for m, row in zip(metrics, stages) if m.get("slurm_job_id")],
    }
    write_json(cfg.io.energy_report, report)
    for s in stages:
        log.info(
            "Accounted %-18s %8.1f J IT (CPU %s; GPU %s)",
            stage_label(s),
            s["it_j"],
            s["cpu_source"],
            s["gpu_source"],
        )
    for seg in segments:
        for p in seg["phases"]:
            log.info(
                "Accounted segment %s phase %-10s %7.2f s %8.1f J IT (CPU %s; GPU %s)",
                seg["segment"],
                p["phase"],
                p["seconds"],
                p["it_j"],
                p["cpu_source"],
                p["gpu_source"],
            )
    for s in report["slurm"]:
        log.info("Slurm job %s (%s): %s", s["job_id"], s["stage"], s["status"])
    t = report["training"]
    log.info(
        "Accounted %.1f J IT, %.1f J facility (PUE %.2f), %.4f g CO2; training %.1f tokens/J IT; DVFS %s, "
        "estimated saving %.1f J (%s)",
        report["total"]["it_j"],
        report["total"]["facility_j"],
        e.pue,
        report["total"]["co2_g"],
        t["tokens_per_it_joule"] or 0,
        "applied" if dvfs["applied"] else "not applied",
        dvfs["estimated_saving_j"],
        dvfs["basis"],
    )
    return {}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="account_energy")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
