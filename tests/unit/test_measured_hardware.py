"""The cluster values a run measured (plan.measured_hardware): solved through the plan's own model, a run's terms made
from a plan of known values give those values back; a run the model cannot reach is one line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainflow.config import compose
from trainflow.config.resilience import hang_threshold_s
from trainflow.errors import TrainflowError
from trainflow.plan.__main__ import main
from trainflow.plan.build import build_plan
from trainflow.plan.from_run import RunTerms
from trainflow.plan.measured_hardware import measured_hardware

SMOKE = ["experiment=smoke", "train.segments=2", "checkpoint.interval_steps=3"]
KNOWN = [
    "cluster.hardware.checkpoint_read_gbps=0.5",
    "cluster.hardware.matmul_efficiency=0.3",
    "cluster.hardware.storage_write_gbps=0.05",
    "resilience.failure_detect_s=2",
]


def terms_of(overrides: list[str], *, failures: int, hangs: int, start_s: float, wait_s: float = 1.0) -> RunTerms:
    """The terms a run of the plan of `overrides` would measure: its step, its blocking save, job starts and restarts
    of `wait_s` unheld and `start_s` held each plus the plan's load, detection as the plan's (dead and hung)."""
    cfg = compose("train_segment", overrides)
    plan = build_plan(cfg, with_remedies=False)
    step, load = plan.step.step_s, plan.goodput.load_s
    hung = hang_threshold_s(cfg.resilience, step)
    detect = ((failures - hangs) * cfg.resilience.failure_detect_s + hangs * hung) / max(1, failures)
    measured = dict.fromkeys(["checkpoint", "lost work", "detection", "restart", "evaluation", "start-up"], 1.0)
    return RunTerms(
        segments=2,
        steps=100,
        failures=failures,
        hangs=hangs,
        step_s=step,
        eval_share=0.1,
        interval_steps=3,
        blocking_s=plan.campaign.save_s,
        write_s=0.0,
        detect_s=detect,
        wait_s=wait_s if failures else 0.0,
        held_s=start_s + load if failures else 0.0,
        starts_s=2 * (wait_s + start_s + load),
        boundary_saves_s=0.0,
        at_risk_s=100.0,
        mtbf_s=30.0,
        hang_share=0.4,
        measured={**measured, "productive": 100 * step, "wall": 200 * step},
    )


def test_a_runs_terms_give_back_the_values_its_plan_rested_on():
    terms = terms_of([*SMOKE, *KNOWN], failures=5, hangs=2, start_s=7.5, wait_s=4.0)
    values = measured_hardware(compose("train_segment", SMOKE), terms)
    assert values == pytest.approx(
        {
            "cluster.hardware.matmul_efficiency": 0.3,
            "cluster.hardware.storage_write_gbps": 0.05,
            "cluster.hardware.checkpoint_read_gbps": 0.5,  # the config's, pinned
            "cluster.hardware.requeue_wait_s": 4.0,
            "cluster.hardware.startup_s": 7.5,
            "cluster.hardware.hot_restart_s": 7.5,
            "resilience.failure_detect_s": 2.0,
        },
        rel=1e-6,
    )
    # Without failures the detection and the wait stay the config's, and the start-up is a job start's rest.
    quiet = measured_hardware(
        compose("train_segment", SMOKE), terms_of([*SMOKE, *KNOWN], failures=0, hangs=0, start_s=7.5, wait_s=0.0)
    )
    assert quiet["resilience.failure_detect_s"] == 30.0 and quiet["cluster.hardware.requeue_wait_s"] == 0.0
    assert quiet["cluster.hardware.startup_s"] == pytest.approx(7.5)


def test_a_step_no_efficiency_gives_and_async_saves_are_one_line_each():
    terms = terms_of([*SMOKE, *KNOWN], failures=0, hangs=0, start_s=5.0)
    with pytest.raises(TrainflowError, match=r"the run's median step \(.* s\) is outside what the plan gives"):
        measured_hardware(compose("train_segment", SMOKE), dataclasses.replace(terms, step_s=1e4))
    with pytest.raises(TrainflowError, match="calibrate from a run with checkpoint.mode=sync"):
        measured_hardware(compose("train_segment", [*SMOKE, "checkpoint.mode=async"]), terms)


def test_the_command_prints_the_values_as_overrides(tmp_path, capsys):
    assert main(["--hardware-from", str(tmp_path), *SMOKE]) == 1  # no terms.json there: one line
    assert "holds no train/<series>/terms.json" in capsys.readouterr().err
    (tmp_path / "train/abc").mkdir(parents=True)
    terms = terms_of([*SMOKE, *KNOWN], failures=3, hangs=1, start_s=6.0)
    (tmp_path / "train/abc/terms.json").write_text(json.dumps(terms.to_json()))
    assert main(["--hardware-from", str(tmp_path), *SMOKE]) == 0
    printed = dict(word.split("=") for word in capsys.readouterr().out.split())
    assert printed["cluster.hardware.matmul_efficiency"] == "0.3" and printed["cluster.hardware.startup_s"] == "6"
