"""The trackers outside a training run: a run without W&B and MLflow imports neither, and MLflow against a real
local tracking server (started here, stopped by its process id) holds two segments' step records in one run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from trainflow.config import compose
from trainflow.config.observe import MlflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.train.step_log import StepRecord

MLFLOW = Path(sys.executable).with_name("mlflow")


def test_a_run_without_wandb_and_mlflow_imports_neither():
    code = (
        "import sys; from trainflow.config import compose; from trainflow.train.recorder import build_trackers; "
        "cfg = compose('train_segment', ['observe.tensorboard=false']); "
        "assert build_trackers(cfg, is_logger=True) == []; "
        "assert not {'wandb', 'mlflow'} & set(sys.modules), {'wandb', 'mlflow'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, log: Path, limit_s: float = 240.0) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if server.poll() is not None:
            pytest.fail(f"mlflow server ended with {server.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"mlflow server did not answer {url}/health within {limit_s:.0f} s: {log.read_text()[-2000:]}")


def record(step: int) -> StepRecord:
    return StepRecord(step, 0.0, 5.0 - 0.25 * step, 1e-3, 1.0, 0.2, 900.0, 0.1, 300.0, 0.01, 0.15, 0.02, 0.0, 0.0)


@pytest.mark.slow  # the server's start: 30 s at load 9
def test_mlflow_runs_of_two_segments_are_one_run_on_a_tracking_server(tmp_path):
    from mlflow.tracking import MlflowClient

    from trainflow.train.mlflow_log import MlflowLog

    port, log = free_port(), tmp_path / "server.log"
    command = [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"]
    command += ["--artifacts-destination", str(tmp_path / "artifacts")]
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=out, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server, log)
        cfg = compose("train_segment", [f"storage.root={tmp_path / 'run'}"])
        run = RunFolder.of(cfg)
        for segment in (0, 1):
            config = {"segment": segment, "model": {"dim": 128}}
            tracker = MlflowLog(MlflowConfig(True, url, "drill"), run=run, name="default", id="abc", config=config)
            for step in range(3 * segment, 3 * segment + 3):
                tracker.step(record(step))
            tracker.evaluation(3 * segment + 3, 4.0 - segment, {"corpus": 4.0 - segment})
            tracker.close()

        client = MlflowClient(url)
        (found,) = client.search_runs([client.get_experiment_by_name("drill").experiment_id])
        assert found.info.run_name == "default" and found.info.status == "FINISHED"
        history = client.get_metric_history(found.info.run_id, "train/loss")
        assert {m.step: m.value for m in history} == {s: record(s).loss for s in range(6)}
        assert [m.step for m in client.get_metric_history(found.info.run_id, "eval/val_loss")] == [3, 6]
        assert found.data.metrics["train/applied"] == 1.0
        assert sum(a.path.startswith("config-segment-") for a in client.list_artifacts(found.info.run_id)) == 2
        assert not Path(run.mlflow_store).exists()  # the server's store, not the local one
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


REPORT = """# Campaign report

## Goodput

| term | seconds | share |
|---|---|---|
| productive | 12.5 | 80 % |
| checkpoint | 3.1 | 20 % |

## Checkpoints

| segment | step | save_s |
|---|---|---|
| 0 | 3 | 0.4 |
"""


def test_the_report_tables_go_to_the_campaigns_wandb_and_mlflow_runs(tmp_path):
    from mlflow.tracking import MlflowClient

    from tests.support import wandb_records
    from trainflow.train.report_log import log_report
    from trainflow.train.trackers import markdown_tables

    goodput, saves = markdown_tables(REPORT)
    assert (goodput.name, goodput.columns, goodput.rows[1]) == (
        "goodput",
        ["term", "seconds", "share"],
        ["checkpoint", "3.1", "20 %"],
    )
    assert (saves.name, saves.rows) == ("checkpoints", [["0", "3", "0.4"]])

    on = ("observe.wandb.enabled=true", "observe.mlflow.enabled=true")
    cfg = compose("report", [f"storage.root={tmp_path}", *on])
    assert log_report(cfg, REPORT) == 2
    run = RunFolder.of(cfg)
    logged = {
        i.nested_key[0]
        for r in wandb_records(Path(run.wandb), "history")
        for i in r.history.item
        if i.nested_key[:1] and i.nested_key[0].startswith("report/")
    }
    assert logged == {"report/goodput", "report/checkpoints"}
    (table,) = Path(run.wandb).glob("wandb/offline-run-*/files/media/table/report/goodput_*.table.json")
    assert json.loads(table.read_text()) == {"columns": goodput.columns, "data": goodput.rows}

    client = MlflowClient(f"sqlite:///{run.mlflow_store}")
    experiment = client.get_experiment_by_name("trainflow").experiment_id
    (found,) = client.search_runs([experiment])
    assert found.data.tags["trainflow.train_hash"] == run.series and found.info.status == "FINISHED"
    table = json.loads(Path(client.download_artifacts(found.info.run_id, "report/goodput.json", tmp_path)).read_text())
    assert table == {"columns": goodput.columns, "data": goodput.rows}
    assert "report/report.md" in {a.path for a in client.list_artifacts(found.info.run_id, "report")}
