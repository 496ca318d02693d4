"""The campaign's W&B and MLflow runs (observe.wandb, observe.mlflow), each started inside its guard
(train.trackers.Guarded): their clients are imported there, so a missing package, a server gone or any error of their
start is one warning line on rank 0, never a failed job.

    trackers = [wandb_tracker(cfg.observe.wandb, RunFolder.of(cfg), name=..., id=..., config=...)]
"""

from __future__ import annotations

from typing import Any

from trainflow.config.observe import MlflowConfig, WandbConfig
from trainflow.config.run_folder import RunFolder
from trainflow.train.trackers import Guarded, Tracker


def wandb_tracker(w: WandbConfig, run: RunFolder, **named: Any) -> Guarded:
    """The campaign's W&B run (observe.wandb), Guarded: its client is imported in the guard, so a missing one warns."""

    def start() -> Tracker:
        from trainflow.train.wandb_log import WandbLog

        return WandbLog(w, folder=run.wandb, **named)

    return Guarded(f"W&B (observe.wandb.mode={w.mode})", start)


def mlflow_tracker(m: MlflowConfig, run: RunFolder, **named: Any) -> Guarded:
    """The campaign's MLflow run (observe.mlflow), Guarded likewise."""

    def start() -> Tracker:
        from trainflow.train.mlflow_log import MlflowLog

        return MlflowLog(m, run=run, **named)

    return Guarded(f"MLflow (observe.mlflow.uri={m.uri or 'sqlite:///' + run.mlflow_store})", start)
