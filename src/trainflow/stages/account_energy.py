"""Energy of every stage of the run: measured where the machine exposes counters, modelled where not.

python -m trainflow.stages.account_energy 'io.metrics=[runs/default/metrics/prepare_data.json]'
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from trainflow.config import CONF_DIR, TrainflowConfig
from trainflow.energy.accounting import dvfs_estimate, facility, stage_energy
from trainflow.stage import StageError, read_json, run_stage, write_json

log = logging.getLogger("trainflow.account_energy")


def run(cfg: TrainflowConfig) -> dict:
    if not cfg.io.metrics:
        raise StageError(
            "io.metrics is empty: pass the stage metrics files, e.g. 'io.metrics=[runs/x/metrics/prepare_data.json]'"
        )
    gpus = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    stages = [
        stage_energy(m, energy=cfg.energy, gpus=gpus if m["stage"] in ("train_segment", "validate_nccl") else 0)
        for m in map(read_json, cfg.io.metrics)
    ]
    segments = [read_json(p) for p in cfg.io.segment_reports]
    tokens = sum((s["end_step"] - s["start_step"]) * cfg.train.global_batch * cfg.model.seq_len for s in segments)
    train_j = sum(s["it_j"] for s in stages if s["stage"] == "train_segment")
    data_s = sum(r["data_s"] for s in segments for r in s["steps"])
    total = facility(sum(s["it_j"] for s in stages), cfg.energy)
    report = {
        "stages": stages,
        "total": total,
        "pue": cfg.energy.pue,
        "grid_gco2_per_kwh": cfg.energy.grid_gco2_per_kwh,
        "training_tokens": tokens,
        "tokens_per_joule": tokens / (train_j * cfg.energy.pue) if train_j else None,
        "dvfs": dvfs_estimate(data_s, gpus=gpus, energy=cfg.energy, applied=False),
        "slurm_consumed_energy": None,
    }
    write_json(cfg.io.energy_report, report)
    for s in stages:
        log.info(
            "Accounted %-18s %8.1f J IT (CPU %s; GPU %s)",
            f"{s['stage']}[{s['segment']}]",
            s["it_j"],
            s["cpu_source"],
            s["gpu_source"],
        )
    log.info(
        "Accounted %.1f J IT, %.1f J facility (PUE %.2f), %.4f g CO2, %.1f training tokens/J",
        total["it_j"],
        total["facility_j"],
        cfg.energy.pue,
        total["co2_g"],
        report["tokens_per_joule"] or 0,
    )
    return {}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="account_energy")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
