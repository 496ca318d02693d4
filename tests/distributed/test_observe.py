"""What training records about itself: TensorBoard scalars equal to the step log, a profiler trace with its
top operators, and memory per step (observe.*)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import make_config, run_segment


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
