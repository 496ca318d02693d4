"""Gate training on the collective network, the nodes and the plan, before any training allocation.

    python -m trainflow.stages.validate_nccl cluster=alps_gh200 parallel=dp64_tp8_pp8

First the stage plans the run (trainflow.plan: memory, step split, throughput, checkpoint interval, energy) and
records the plan in nccl.json; a plan that does not fit in device memory stops the stage, and with it the DAG, before
any allocation or process group. Then it launches a job of the training shape (the same submitit job training
submits, so it measures the links training will use) in which every rank times the all_reduce sweep over the world
and each collective the layout runs on its own groups, and reports its node (trainflow.gate). The gate's verdict
(trainflow.gate.verdict) stops the DAG on a slow pattern (writing the slowest groups' hosts to nccl-exclude.txt in
sbatch --exclude form where another group of the pattern meets the threshold; none where no group does, which is the
layout's limit, not a host's), a stack off the compatibility table, or a checkpoint folder striped too thin.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.atomic import write_text_atomic
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.energy.metrics import StageFigures
from trainflow.gate.calibrate import calibrate, with_hardware
from trainflow.gate.env import audit_env
from trainflow.gate.nodes import stripe_count
from trainflow.gate.patterns import judge
from trainflow.gate.report import Calibration, NcclReport, Stripes
from trainflow.gate.verdict import problems
from trainflow.launch import LaunchError, build_executor, run_job
from trainflow.launch.gate_job import BandwidthJob
from trainflow.plan.build import Plan, build_plan
from trainflow.stage import StageError, stage_log, stage_main, write_json

log = stage_log(__file__)


def run(cfg: TrainflowConfig) -> StageFigures:
    plan = build_plan(cfg, with_remedies=False)
    if why := plan.overflow or (plan.goodput and plan.goodput.cannot_finish):
        raise StageError(f"validate_nccl stopped before launching: {why}")
    log.info(
        "Planned %.3f s per step, %.1f tokens/s/device, %.2f GB of %.2f GB per device",
        plan.step.step_s,
        plan.step.tokens_per_s_per_device,
        plan.memory.total / 1e9,
        plan.capacity_bytes / 1e9,
    )
    name = f"{cfg.run}-validate_nccl"
    executor = build_executor(
        cfg.cluster.allocation, world_size=cfg.parallel.world_size, folder=cfg.io.submitit, name=name
    )
    try:
        result = run_job(executor, BandwidthJob(cfg), max_pending_s=cfg.resilience.max_pending_s)[0]
    except LaunchError as err:
        raise LaunchError(f"validate_nccl failed: {err}") from err
    hosts = [rank[0] for rank in result["ranks"]]
    names = [h.host for h in hosts]
    patterns, exclude, everywhere = judge([rank[1] for rank in result["ranks"]], names, cfg.cluster.gate.busbw_gbps)
    calibrated, calibration = calibrated_plan(cfg, result, patterns, names)
    folder = Path(cfg.io.checkpoints).parent  # the checkpoint series' parent: it exists before training
    folder.mkdir(parents=True, exist_ok=True)
    count, source = stripe_count(str(folder))
    report = NcclReport(
        world_size=result["world_size"],
        backend=cfg.cluster.runtime.backend,
        sweep=result["sweep"],
        patterns=patterns,
        hosts=hosts,
        checkpoint_stripes=Stripes(str(folder), count, source),
        env_warnings=audit_env({**os.environ, **cfg.cluster.runtime.env}),
        threshold_gbps=cfg.cluster.gate.min_busbw_gbps,
        plan=calibrated,
        calibration=calibration,
    )
    log_measurements(report)
    found = problems(report.sweep, patterns, hosts, count, cfg.cluster.gate)
    if exclude:  # the hosts of the slowest group of every pattern below its gate, in sbatch --exclude's form
        excluded = RunFolder.of(cfg).nccl_exclude
        write_text_atomic(excluded, ",".join(exclude) + "\n")
        found.append(f"hosts to leave out written to {excluded}: sbatch --exclude={','.join(exclude)}")
    for row in (row for row in patterns if row.pattern in everywhere):
        found.append(
            f"no group of {row.pattern}'s {row.groups} meets cluster.gate.busbw_gbps.{row.pattern}"
            f"({row.threshold_gbps}), so it blames no host: the layout cannot meet it (does a group cross the "
            f"network?); set the threshold to what the layout reaches or keep the groups inside a node"
        )
    if found:
        raise StageError("validate_nccl failed: " + "; ".join(found))
    write_json(cfg.io.nccl_report, report.to_json())
    log.info("Validated %s over %d ranks: passed", report.backend, report.world_size)
    return StageFigures(ranks=report.world_size, rank_cpu_s=sum(rank[2] for rank in result["ranks"]))


def calibrated_plan(cfg: TrainflowConfig, result: dict, patterns: list, hosts: list[str]) -> tuple[Plan, Calibration]:
    """The plan on the constants the job measured (gate.calibrate), and what was measured."""
    probes = [rank[3] for rank in result["ranks"]]
    values, calibration = calibrate(cfg, probes=probes, patterns=patterns, sweep=result["sweep"], hosts=hosts)
    plan = build_plan(with_hardware(cfg, **values), with_remedies=False)
    for c in calibration.constants:
        log.info("Measured cluster.hardware.%s %.4g (configured %.4g)", c.name, c.measured, c.configured)
    log.info(
        "Planned %.4f s per step on the measured constants (%.4f s on the configured ones), %.1f tokens/s/device",
        plan.step.step_s,
        calibration.configured_step_s,
        plan.step.tokens_per_s_per_device,
    )
    return plan, calibration


def log_measurements(report: NcclReport) -> None:
    for row in report.sweep:
        log.info(
            "all_reduce %10d bytes: %8.3f ms, algbw %.3f GB/s, busbw %.3f GB/s",
            row.bytes,
            row.time_s * 1e3,
            row.algbw_gbps,
            row.busbw_gbps,
        )
    if not report.sweep:
        log.info("World size 1: no collective to measure; the gate passes")
    for row in report.patterns:
        gate = row.threshold_gbps if row.threshold_gbps is not None else "none"
        log.info(
            "%-17s %d groups of %d, %d bytes: slowest %.3f GB/s busbw (gate %s)",
            *(row.pattern, row.groups, row.group_size, row.bytes, row.busbw_gbps, gate),
        )
    for warning in report.env_warnings:
        log.warning("%s", warning)


if __name__ == "__main__":
    stage_main(run, config_name="validate_nccl")
