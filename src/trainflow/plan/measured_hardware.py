"""The cluster values a finished run measured, as the overrides a later plan rests on: a plan made from config alone,
before a run, with the hardware it will meet (tests/workflow/test_goodput_drill.py freezes such a prediction and
runs the campaign at three seeds against it).

    python -m trainflow.plan --hardware-from runs/drill experiment=smoke ...   # the run's own overrides

Each value is solved from the run's measured terms (terms.json: trainflow.plan.from_run.RunTerms) through the plan's
own model of it, so that the plan of the same config gives back what the run measured:
- cluster.hardware.matmul_efficiency: the plan's step time (plan.step) equals the run's median step (bisection: the
  step falls as the efficiency rises);
- cluster.hardware.storage_write_gbps: the plan's blocking save (plan.campaign, synchronous checkpoints) equals the
  run's mean blocking save;
- cluster.hardware.requeue_wait_s, startup_s and hot_restart_s: a restart's measured wait (from the failure's
  detection to its ranks' start: no failure strikes in it, as in an allocation's wait) and the rest of its start
  less the plan's load, which failures can strike (a restart here starts the processes again, as a job does); from a
  run without failures, a job start's measured seconds (its start-up term over its jobs) less the config's wait and
  the load;
- resilience.failure_detect_s: a dead rank's detection, from the run's mean detection less its hangs' (each the
  plan's hang threshold); the config's where the run had no failure.
The load's rate (checkpoint_read_gbps) is given as the config has it, pinned: the start-up is what a job start took
beyond the plan's load at that rate.
The failure rate, hang share and everything the campaign is (steps, intervals, evaluation) stay the config's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from trainflow.config.resilience import hang_threshold_s
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import TrainflowError
from trainflow.plan.campaign import plan_campaign
from trainflow.plan.core import plan_core
from trainflow.plan.from_run import RunTerms
from trainflow.plan.scenarios import load_times

ITERATIONS = 60
"""Bisection steps: 2^-60 of the bracket, far below any measurement's noise."""
SHORTEST_S = 0.1
"""The least a fitted detection or start-up may be: a process's own start-up is never faster."""


def with_hardware(cfg: TrainflowConfig, **values: float) -> TrainflowConfig:
    """cfg with cluster.hardware's `values` replaced (the plan reads them from there; gate.calibrate's calibrated plan
    too)."""
    hardware = dataclasses.replace(cfg.cluster.hardware, **values)
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, hardware=hardware))


def solved(f: Callable[[float], float], target: float, low: float, high: float, what: str) -> float:
    """x in [low, high] where the decreasing f(x) is `target`; one TrainflowError naming `what` outside that range."""
    if not f(high) <= target <= f(low):
        raise TrainflowError(
            f"the run's {what} ({target:.4g} s) is outside what the plan gives between {low:g} and {high:g} "
            f"({f(low):.4g}-{f(high):.4g} s): plan it with a cluster preset nearer this machine"
        )
    for _ in range(ITERATIONS):
        mid = (low + high) / 2
        low, high = (mid, high) if f(mid) > target else (low, mid)
    return (low + high) / 2


def measured_hardware(cfg: TrainflowConfig, terms: RunTerms) -> dict[str, float]:
    """The override -> value of each cluster value the run `terms` measured (the module docstring), for cfg's
    campaign (the run's own config)."""
    if cfg.checkpoint.mode != "sync":
        raise TrainflowError(
            f"--hardware-from fits the storage's rate to synchronous saves; the run's checkpoint.mode is "
            f"{cfg.checkpoint.mode}: calibrate from a run with checkpoint.mode=sync"
        )
    step = solved(
        lambda eff: plan_core(with_hardware(cfg, matmul_efficiency=eff)).step.step_s,
        terms.step_s,
        0.01,
        1.0,
        "median step",
    )
    cfg = with_hardware(cfg, matmul_efficiency=step)
    core = plan_core(cfg)

    def save_s(gbps: float) -> float:
        return plan_campaign(
            with_hardware(cfg, storage_write_gbps=gbps), core.setup, step_s=core.step.step_s, memory=core.memory
        ).save_s

    write = solved(save_s, terms.blocking_s, 1e-4, 1e4, "blocking save")
    cfg = with_hardware(cfg, storage_write_gbps=write)
    campaign = plan_campaign(cfg, core.setup, step_s=core.step.step_s, memory=core.memory)
    load = load_times(cfg, campaign, core.setup).single_s
    if terms.failures:
        wait, start = terms.wait_s, terms.held_s - load
    else:
        wait = cfg.cluster.hardware.requeue_wait_s
        start = terms.starts_s / max(1, terms.segments) - load - wait
    start = max(SHORTEST_S, start)
    hung = hang_threshold_s(cfg.resilience, core.step.step_s)
    dead = terms.failures - terms.hangs
    detect = (terms.detect_s * terms.failures - terms.hangs * hung) / dead if dead else cfg.resilience.failure_detect_s
    return {
        "cluster.hardware.matmul_efficiency": step,
        "cluster.hardware.storage_write_gbps": write,
        # pinned: a preset that reads as fast as it writes (an interpolation) would otherwise read at the fitted rate
        "cluster.hardware.checkpoint_read_gbps": cfg.cluster.hardware.checkpoint_read_gbps,
        "cluster.hardware.requeue_wait_s": wait,
        "cluster.hardware.startup_s": start,
        "cluster.hardware.hot_restart_s": start,
        "resilience.failure_detect_s": max(SHORTEST_S, detect),
    }


def as_overrides(values: dict[str, float]) -> list[str]:
    """`values` as Hydra overrides, each to 4 significant digits."""
    return [f"{key}={value:.4g}" for key, value in values.items()]
