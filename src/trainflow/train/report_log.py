"""The campaign report in its W&B and MLflow runs (observe.wandb, observe.mlflow): once report.md is written, the
report stage resumes the campaign's runs and adds its tables (and, to MLflow, the report itself).

    log_report(cfg, text)   # trainflow.stages.report; nothing without observe.wandb or observe.mlflow
"""

from __future__ import annotations

from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.train.trackers import RunTracker, markdown_tables


def report_trackers(cfg: TrainflowConfig) -> list[RunTracker]:
    """The campaign's runs observe.* keeps, resumed without adding a config (the report stage's is no training's)."""
    o, run, trackers = cfg.observe, RunFolder.of(cfg), []
    named = {"name": cfg.run, "id": run.series, "config": None}
    if o.wandb.enabled:
        from trainflow.train.wandb_log import WandbLog

        trackers.append(WandbLog(o.wandb, folder=run.wandb, **named))
    if o.mlflow.enabled:
        from trainflow.train.mlflow_log import MlflowLog

        trackers.append(MlflowLog(o.mlflow, run=run, **named))
    return trackers


def log_report(cfg: TrainflowConfig, text: str) -> int:
    """Add the report's tables to every run tracker on; how many tables each took."""
    tables = markdown_tables(text)
    for tracker in report_trackers(cfg):
        tracker.report(text, tables)
        tracker.close()
    return len(tables)
