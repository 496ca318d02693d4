"""The experiment trackers a segment's metrics go to besides TensorBoard (cfg.observe.wandb, cfg.observe.mlflow;
trainflow.train.trackers writes them).

    python -m trainflow.stages.train_segment observe.wandb.enabled=true observe.mlflow.enabled=true
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.domain import checked

TRACKER_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
URI = r"([a-z][a-z0-9+.-]*://[^\s'\"`$;|&<>]*)?"


@dataclass
class WandbConfig:
    """Weights & Biases: one W&B run per checkpoint series, its id the series' name (config.identity), resumed by every
    segment, restart and change of settings; its files under the run's train folder (RunFolder.wandb)."""

    enabled: bool = False
    project: str = checked("trainflow", pattern=TRACKER_NAME, fix="letters, digits, _ . - and no leading dot")
    entity: str = checked("", pattern=f"({TRACKER_NAME})?", fix="a W&B team or user name, or empty for your default")
    mode: str = checked("offline", one_of=("offline", "online"))
    """offline (the default; compute nodes rarely reach the internet): `wandb sync <its folder>` uploads it later."""


@dataclass
class MlflowConfig:
    """MLflow: one MLflow run per checkpoint series in `experiment`, found again by its tag trainflow.train_hash (the
    series' name: the tag kept its first name, so runs logged before series stay found), resumed by every segment,
    restart and change of settings."""

    enabled: bool = False
    uri: str = checked("", pattern=URI, fix="a tracking URI such as http://mlflow.example:5000 or sqlite:///path.db")
    """The tracking URI; empty: a SQLite store in the run folder (RunFolder.mlflow_store)."""
    experiment: str = checked("trainflow", pattern=TRACKER_NAME, fix="letters, digits, _ . - and no leading dot")
