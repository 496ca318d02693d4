"""trainflow.plan.failures and the planner's bounds: the exact expectation against the Monte Carlo of the same model,
the caps that keep a plan's time bounded, the overflow reported before any goodput is simulated, and the one line of a
campaign that cannot finish (issue 36)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from trainflow.config import compose
from trainflow.plan import build as build_module
from trainflow.plan.__main__ import main
from trainflow.plan.build import build_plan
from trainflow.plan.failures import Timeline, expected, failures, simulate
from trainflow.plan.goodput import FINISH_FLOOR, Method

SEED_BASELINE = Timeline(
    work_s=3593 * 3600.0,
    interval_s=1871.0,
    blocking_s=121.0,
    write_s=0.0,
    detect_s=300.0,
    wait_s=300.0,
    held_s=411.0,
    mtbf_s=14400.0,
    jobs_s=3e5,
)
"""The seed's baseline scenario at MTBF 4 h, in round figures."""
ASYNC = dataclasses.replace(SEED_BASELINE, interval_s=124.0, blocking_s=0.0565, write_s=121.0, detect_s=50.0)
SHORT = Timeline(1000.0, 300.0, 10.0, 250.0, 10.0, 20.0, 30.0, 500.0, 50.0)
"""Four pieces, a write nearly as long as the interval, a few failures: no normal approximation to lean on."""


@pytest.mark.parametrize("times", [SEED_BASELINE, ASYNC, SHORT], ids=["sync", "async", "short"])
def test_the_expectation_is_the_simulations_mean(times):
    """The renewal expectation is the Monte Carlo's limit: within 0.2 points of 4000 trials' mean where failures
    are many, within the trials' noise where they are few; its band matches the trials' where the sum is normal."""
    sim = simulate(times, trials=4000, seed=1)
    mean, low, high = expected(times)
    noise = 3 * sim.std() / np.sqrt(sim.size)
    assert mean == pytest.approx(sim.mean(), abs=max(0.002, noise))
    if failures(times) > 100:
        assert (low, high) == pytest.approx(tuple(np.percentile(sim, (5, 95))), abs=0.002)
    # A failure per MTBF of held time, and each adds D and the wait, which no failure strikes: 80.2 % goodput.
    wall = SEED_BASELINE.work_s / 0.802 - SEED_BASELINE.jobs_s
    assert failures(SEED_BASELINE) == pytest.approx(wall / (14400 + 300 + 300), rel=0.01)


def test_without_failures_the_expectation_is_exact():
    times = dataclasses.replace(SHORT, write_s=5.0, mtbf_s=1e15)
    assert expected(times) == pytest.approx((1000 / (1000 + 3 * 10 + 50),) * 3)
    assert failures(times) == pytest.approx(0, abs=1e-9)


def test_a_simulation_that_runs_past_its_passes_gives_up_and_an_overflowing_wall_is_zero():
    assert simulate(SEED_BASELINE, trials=8, seed=0, max_passes=10) is None
    hopeless = dataclasses.replace(SEED_BASELINE, interval_s=12390.0, mtbf_s=900.0)  # e^14 tries per checkpoint
    assert 0 < expected(hopeless)[0] < 1e-5
    assert expected(dataclasses.replace(hopeless, mtbf_s=10.0)) == (0.0, 0.0, 0.0)  # e^1300: past a float


def goodput(*overrides: str):
    return build_plan(compose("train_segment", ["experiment=llama70b_alps", *overrides]), with_remedies=False).goodput


def test_many_failures_switch_to_the_expectation_and_say_so():
    """At MTBF 0.2 h each trial would hold ~30,000 failures: the plan gives the expectation, in seconds."""
    start = time.process_time()
    g = goodput("cluster.hardware.mtbf_hours=0.2")
    assert time.process_time() - start < 5
    assert all(s.method is Method.EXPECTED and s.failures > 6000 for s in g.scenarios)
    assert any("exact expectation" in note for note in g.notes)
    assert all(s.method is Method.SIMULATED for s in goodput().scenarios)  # the seed's case is still sampled


def test_a_campaign_that_cannot_finish_says_why_in_one_line(capsys):
    """Detection and restart as a new job (530 s: no spare nodes, the queue's 300 s, the start-up's parts at 4096
    ranks 36 s, the load 111 s) outlast an MTBF of 0.1 h; a 1000-step interval (11366 s) at 0.25 h leaves ~0 goodput;
    the seed's MTBF 4 h finishes."""
    slow = goodput("cluster.hardware.mtbf_hours=0.1", "cluster.allocation.spare_nodes=0").cannot_finish
    assert slow is not None and "\n" not in slow and "take longer than the MTBF" in slow and "0.1 h" in slow
    fixed = ("checkpoint=fixed", "checkpoint.interval_steps=1000", "cluster.hardware.mtbf_hours=0.25")
    g = goodput(*fixed)
    assert g.scenarios[1].simulated < FINISH_FLOOR
    assert "11366 s without a failure" in g.cannot_finish and "checkpoint.interval_steps" in g.cannot_finish
    assert goodput().cannot_finish is None
    # the smoke campaign on the local Slurm cluster: seconds of steps against a measured 49 s start-up per job, 0.4 %
    # goodput, but no failure expected in it: it finishes (validate_nccl stopped it before 5.6e-5 failures counted)
    smoke = build_plan(compose("train_segment", ["experiment=smoke", "cluster=slurm_local"]), with_remedies=False)
    assert smoke.goodput.scenarios[1].simulated < FINISH_FLOOR and smoke.goodput.cannot_finish is None
    assert main(["experiment=llama70b_alps", *fixed]) == 1
    out = capsys.readouterr()
    assert "CANNOT FINISH: the campaign cannot finish" in out.out
    assert out.err.strip().splitlines() == [f"trainflow.plan: {g.cannot_finish}"]


def test_an_overflow_is_reported_before_any_goodput_is_simulated(monkeypatch, capsys):
    """A 70B model on one device: the overflow line, in seconds, and no goodput simulated (issue 36: 37 minutes)."""

    def no_goodput(*args, **kwargs):
        raise AssertionError("goodput simulated for a plan that does not fit")

    monkeypatch.setattr(build_module, "plan_goodput", no_goodput)
    start = time.perf_counter()
    assert main(["model=llama3_70b", "parallel=single", "phase=pretrain"]) == 1  # one phase: a plain plan
    assert time.perf_counter() - start < 5
    out = capsys.readouterr()
    assert "OVERFLOW: the plan does not fit" in out.out and "not simulated, the plan does not fit" in out.out
    assert out.err.startswith("trainflow.plan: the plan does not fit: pipeline rank 0 needs")
    plan = build_plan(compose("train_segment", ["model=llama3_70b", "parallel=single"]), with_remedies=False)
    assert plan.overflow is not None and plan.goodput is None
