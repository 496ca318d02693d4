"""Training metrics as an MLflow run (observe.mlflow; a Tracker), on a tracking server or a local store.

    mlflow ui --backend-store-uri sqlite:///runs/default/mlflow.db     # the local store (observe.mlflow.uri empty)

One MLflow run per campaign in observe.mlflow.experiment, tagged with the hash of what training reads and found
again by that tag, so every segment and restart resumes it, and the report stage, which adds the report and its
tables. Each training job adds its resolved config as the artifact config-segment-<i>-<time>.json (a run's params
cannot change, and a segment's config names its segment).

Every request to a tracking server is bounded (config.observe: REQUEST_S, RETRIES, a backoff of 1 s doubling): MLflow
reads its limits from the environment at each request, so they are set here, lowered where the user's are higher.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from trainflow.config.observe import REQUEST_S, RETRIES, MlflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.train.trackers import RunTracker, Table

BOUNDS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": REQUEST_S,
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": RETRIES,
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": 1,
}
"""MLflow's request limits (its defaults: 120 s, 7 retries, a factor of 2: one request to a refused port took 250 s)."""
TAG = "trainflow.train_hash"
"""The series' name (RunFolder.series) on its MLflow run: named before series were, kept so those runs stay found."""


class MlflowLog(RunTracker):
    def __init__(self, m: MlflowConfig, *, run: RunFolder, name: str, id: str, config: dict[str, Any] | None) -> None:  # noqa: A002
        for variable, cap in BOUNDS.items():  # not `name`: that is the run's
            given = os.environ.get(variable, "")
            os.environ[variable] = str(min(int(given), cap) if given.isdigit() else cap)
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # a retry each: the guard's line says it
        local = f"sqlite:///{os.path.abspath(run.mlflow_store)}"
        if not m.uri:
            Path(run.mlflow_store).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=m.uri or local)
        experiment = self.client.get_experiment_by_name(m.experiment)
        artifacts = None if m.uri else Path(os.path.abspath(run.mlflow_artifacts)).as_uri()
        exp = experiment.experiment_id if experiment else self.client.create_experiment(m.experiment, artifacts)
        found = self.client.search_runs([exp], filter_string=f"tags.`{TAG}` = '{id}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(exp, run_name=name, tags={TAG: id}).info.run_id
        if config is not None:
            self.client.log_dict(self.run_id, config, f"config-segment-{config['segment']}-{time.time():.0f}.json")

    def log(self, scalars: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def report(self, text: str, tables: list[Table]) -> None:
        """The report as report/report.md and each table as report/<name>.json (columns and data)."""
        self.client.log_text(self.run_id, text, "report/report.md")
        for t in tables:
            columns = {c: [row[i] for row in t.rows] for i, c in enumerate(t.columns)}
            self.client.log_table(self.run_id, data=columns, artifact_file=f"report/{t.name}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
