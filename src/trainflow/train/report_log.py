"""The campaign report in its W&B and MLflow runs (observe.wandb, observe.mlflow): once report.md is written, the
report stage resumes the campaign's runs and adds its tables (and, to MLflow, the report itself).

    log_report(cfg, text)   # trainflow.stages.report; nothing without observe.wandb or observe.mlflow
"""

from __future__ import annotations

from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.train.run_trackers import mlflow_tracker, wandb_tracker
from trainflow.train.trackers import Guarded, markdown_tables


def report_trackers(cfg: TrainflowConfig) -> list[Guarded]:
    """The campaign's runs observe.* keeps, resumed without adding a config (the report stage's is no training's);
    each Guarded, so a tracker that fails costs the report one warning line."""
    o, run, trackers = cfg.observe, RunFolder.of(cfg), []
    named = {"name": cfg.run, "id": run.series, "config": None}
    if o.wandb.enabled:
        trackers.append(wandb_tracker(o.wandb, run, **named))
    if o.mlflow.enabled:
        trackers.append(mlflow_tracker(o.mlflow, run, **named))
    return trackers


def log_report(cfg: TrainflowConfig, text: str) -> int:
    """Add the report's tables to every run tracker on; how many tables each took."""
    tables = markdown_tables(text)
    for tracker in report_trackers(cfg):
        tracker.report(text, tables)
        tracker.close()
    return len(tables)
