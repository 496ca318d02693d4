"""Training metrics as a Weights & Biases run (observe.wandb; a Tracker), offline by default.

    wandb sync runs/default/train/<series>/wandb/wandb/offline-run-*    # upload an offline campaign later

One W&B run per campaign: its id is the hash of what training reads, so every segment and restart resumes it
(offline, each job writes its own offline-run folder of the same id; `wandb sync` joins them), and so does the
report stage, adding the report's tables. Its files lie under the run's train folder (RunFolder.wandb, as WANDB_DIR);
its config is the training job's resolved config.

Online, every wait is bounded (config.observe): the start by STALL_S (W&B's own: 90 s, with retries that took 103 s
without a network), each GraphQL request by REQUEST_S and RETRIES, and the upload at the end by STALL_S, after which
what is left stays in the folder for `wandb sync`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import wandb

from trainflow.config.observe import REQUEST_S, RETRIES, STALL_S, WandbConfig
from trainflow.train.trackers import RunTracker, Table


class WandbLog(RunTracker):
    def __init__(self, w: WandbConfig, *, folder: str, name: str, id: str, config: dict[str, Any] | None) -> None:  # noqa: A002
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=w.project,
            entity=w.entity or None,
            name=name,
            id=id,
            resume="allow",
            mode=w.mode,
            dir=folder,
            config=config,
            settings=wandb.Settings(
                silent=True,
                console="off",
                init_timeout=STALL_S,
                finish_timeout=STALL_S,
                x_graphql_timeout_seconds=REQUEST_S,
                x_graphql_retry_max=RETRIES,
                x_file_stream_timeout_seconds=REQUEST_S,
                x_file_stream_retry_max=RETRIES,
            ),
        )

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def report(self, text: str, tables: list[Table]) -> None:
        """Each table as report/<name> (a W&B table; its step the run's last)."""
        self.run.log({f"report/{t.name}": wandb.Table(columns=t.columns, data=t.rows) for t in tables})

    def close(self) -> None:
        self.run.finish()
