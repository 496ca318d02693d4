"""What training records about itself: TensorBoard scalars equal to the step log, a profiler trace with its
top operators, and memory per step (observe.*)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import make_config, run_segment
from tests.support import wandb_history, wandb_records
from trainflow.status.read import State, read_status

TRACKERS = ("observe.wandb.enabled=true", "observe.mlflow.enabled=true")


def test_tensorboard_profile_and_memory_are_recorded(tmp_path, tokens):
    run = ("parallel=single", "train.segments=1", "train.segment_steps=5", "observe.profile=true")
    summary = run_segment(tmp_path, tokens, *run, "observe.profile_steps=2")
    train_dir = Path(make_config("train_segment", tmp_path, *run, tokens=tokens).io.segment_report).parent

    events = EventAccumulator(str(train_dir / "tensorboard"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("train/loss")}
    assert logged == pytest.approx({r["step"]: r["loss"] for r in summary["steps"]}, rel=1e-6)  # float32 events
    assert sorted(logged) == [0, 1, 2, 3, 4]
    assert [e.step for e in events.Scalars("eval/val_loss")] == [e["step"] for e in summary["evals"]]
    assert {"train/mfu", "train/memory_mb", "train/compute_s"} <= set(events.Tags()["scalars"])

    profile = summary["profile"]
    trace = json.loads(Path(profile["trace"]).read_text())
    assert sum(e.get("name") == "ProfilerStep#3" for e in trace["traceEvents"]) == 1  # active steps 2 and 3
    assert not any(e.get("name") == "ProfilerStep#1" for e in trace["traceEvents"])  # step 0 waits, 1 warms up
    top = profile["top"]
    assert top and any(op["name"] in ("aten::mm", "aten::addmm", "aten::bmm") for op in top)
    assert [op["self_ms"] for op in top] == sorted((op["self_ms"] for op in top), reverse=True)
    assert 0 < sum(op["share"] for op in top) <= 1 + 1e-9

    assert all(r["memory_mb"] > 10 for r in summary["steps"])  # a resident torch process holds 100s of MB

    status = read_status(tmp_path)  # the finished one-segment campaign, as trainflow.status reads it
    assert (status.state, status.done, status.step, status.total_steps) == (State.FINISHED, [0], 5, 5)
    assert status.loss == summary["steps"][-1]["loss"] and status.checkpoint.step == 5 and status.failures == []


@pytest.mark.slow  # two segments with W&B and MLflow: 74 s at load 9
def test_status_and_trackers_follow_the_default_campaign(tmp_path, tokens):
    """The default campaign (two segments) as trainflow.status reads it between its segments, while the second one
    appends its first step (half a line written), and when it has finished; and as its W&B run (offline) and MLflow
    run (the local store) hold it: both segments' losses in one run each, resumed."""
    run = ("parallel=single", "train.segments=2", "train.segment_steps=3", *TRACKERS)
    first = run_segment(tmp_path, tokens, *run, "segment=0")
    between = read_status(tmp_path)
    assert (between.state, between.done, between.in_flight, between.step) == (State.WAITING, [0], 1, 3)
    assert between.checkpoint.step == 3 and not between.checkpoint.verified
    assert between.loss == first["steps"][-1]["loss"] and between.eta_s == pytest.approx(3 * between.step_s)
    assert 0 < between.goodput == pytest.approx(first["goodput"]["goodput"])

    ckpts = Path(make_config("train_segment", tmp_path, *run, tokens=tokens).io.checkpoints)
    steps, spans = ckpts / "steps.jsonl", ckpts / "spans.jsonl"
    kept = steps.read_text(), spans.read_text()
    now = time.time()
    record = {**first["steps"][-1], "step": 3, "started": now - 1}
    steps.write_text(kept[0] + json.dumps(record) + "\n" + json.dumps(record)[:40])
    spans.write_text(
        kept[1] + json.dumps({"segment": 1, "kind": "step", "step": 3, "started": now - 1, "seconds": 0.5}) + "\n"
    )
    running = read_status(tmp_path, now=now)
    assert (running.state, running.in_flight, running.step) == (State.RUNNING, 1, 4)
    assert running.last_step_age_s == pytest.approx(1 - record["step_s"])
    steps.write_text(kept[0])
    spans.write_text(kept[1])

    second = run_segment(tmp_path, tokens, *run, "segment=1")
    done = read_status(tmp_path)
    assert (done.state, done.done, done.in_flight, done.step, done.total_steps) == (State.FINISHED, [0, 1], None, 6, 6)
    assert done.loss == second["steps"][-1]["loss"] and done.eta_s is None and done.failures == []
    assert done.checkpoint.step == 6
    walls = [s["goodput"]["wall_s"] for s in (first, second)]
    productive = [s["goodput"]["seconds"]["productive"] for s in (first, second)]
    assert done.goodput == pytest.approx(sum(productive) / sum(walls))

    losses = {r["step"]: r["loss"] for s in (first, second) for r in s["steps"]}
    folder = tmp_path / "train" / done.series / "wandb"
    assert len(list(folder.glob("wandb/offline-run-*"))) == 2  # one per segment's job ...
    assert {r.run.run_id for r in wandb_records(folder, "run")} == {done.series}  # ... of one run
    history = wandb_history(folder)
    assert {step: row["train/loss"] for step, row in history.items() if "train/loss" in row} == losses
    assert {step for step, row in history.items() if "eval/val_loss" in row} == {0, 3, 6}

    from mlflow.tracking import MlflowClient  # the trackers' clients only where they are tested: seconds to import

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("trainflow").experiment_id])
    assert found.data.tags["trainflow.train_hash"] == done.series and found.info.status == "FINISHED"
    assert {m.step: m.value for m in client.get_metric_history(found.info.run_id, "train/loss")} == losses
    assert len([a for a in client.list_artifacts(found.info.run_id) if a.path.startswith("config-segment-")]) == 2
