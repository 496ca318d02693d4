"""The gate's job: on an allocation of the training shape, every rank times the collectives training will run
(trainflow.gate) and reports its node. validate_nccl runs it before training; train_segment runs it again after a hang
that no rank's evidence could pin on a host, to find the slow one before it restarts: on a new allocation
(slow_hosts), or, in a job with spare nodes, as a step on the job's own hosts (checked), where the hang was.

    python -m trainflow.stages.validate_nccl cluster=alps_gh200 parallel=dp64_tp8_pp8
"""

from __future__ import annotations

import functools
import logging
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import torch.distributed as dist

from trainflow.config import ParallelDims, TrainflowConfig, TrainflowError
from trainflow.energy.meter import cpu_seconds
from trainflow.gate.calibrate import probe_compute
from trainflow.gate.nodes import node_facts
from trainflow.gate.patterns import judge, sweep, time_patterns
from trainflow.gate.report import HostFacts
from trainflow.host import hostname
from trainflow.launch.executors import build_executor
from trainflow.launch.job_end import run_job
from trainflow.launch.steps import Steps
from trainflow.launch.task import distributed_task
from trainflow.parallel.mesh import build_mesh
from trainflow.stack import versions

log = logging.getLogger(__name__)


class BandwidthJob:
    """The submitit task: every rank sweeps the world, times the layout's patterns on its groups and its devices'
    compute rate (gate.calibrate); rank 0 returns every rank's patterns, node facts, CPU time and compute probe."""

    def __init__(self, cfg: TrainflowConfig) -> None:
        self.cfg = cfg

    def __call__(self) -> dict:
        c, t = self.cfg.cluster, self.cfg.train
        with distributed_task(c.runtime) as (_, world, device, _):
            rows, patterns, mesh = [], [], None
            if world > 1:
                rows = sweep(c.gate.sweep_mb, iters=c.gate.sweep_iters, device=device)
                dims = ParallelDims.from_config(
                    self.cfg.parallel, self.cfg.model, world_size=world, global_batch=t.global_batch
                )
                nbytes = int(max(c.gate.sweep_mb) * 2**20)
                mesh = build_mesh(dims, device.type)
                patterns = time_patterns(dims, mesh, nbytes=nbytes, iters=c.gate.sweep_iters, device=device)
            probe = probe_compute(self.cfg, mesh, device)
            ranks = [None] * world
            host = HostFacts(host=hostname(), node=node_facts(), versions=versions())
            dist.all_gather_object(ranks, (host, patterns, cpu_seconds(), probe))  # CPU time: the stage's energy
        return {"world_size": world, "sweep": rows, "ranks": ranks}


def slow_hosts(cfg: TrainflowConfig, *, exclude: Sequence[str], name: str) -> tuple[list[str], str]:
    """The hosts of every pattern's slowest group below its gate (cluster.gate.busbw_gbps), timed by the gate's job
    on a new allocation of the training shape without `exclude` (Slurm; one machine has no other host), and what the
    checks found, in words."""
    a = cfg.cluster.allocation
    executor = build_executor(a, world_size=cfg.parallel.world_size, folder=cfg.io.submitit, name=name, exclude=exclude)
    job = functools.partial(run_job, executor, BandwidthJob(cfg), max_pending_s=cfg.resilience.max_pending_s)
    return found_by(cfg, job, "on a new allocation")


def checked(cfg: TrainflowConfig, steps: Steps, hosts: list[str], folder: Path) -> tuple[list[str], str]:
    """The same checks inside a supervised job, as a step on its own `hosts` (launch.steps), where the hang was."""
    return found_by(cfg, lambda: steps.wait(steps.launch(BandwidthJob(cfg), hosts, folder)), "inside the job")


def found_by(cfg: TrainflowConfig, job: Callable[[], list], where: str) -> tuple[list[str], str]:
    """The slow hosts the gate's job (`job`: every rank's result) finds, and the words for it. A check that cannot run
    finds nobody: the restart that follows blames no host on a guess, and is counted like any other."""
    try:
        result = job()[0]
    except (TrainflowError, OSError, subprocess.SubprocessError) as err:
        log.warning("The gate's checks %s could not run: %s", where, err)
        return [], f"the gate's checks {where} could not run ({str(err)[:300]}): no host blamed"
    names = [rank[0].host for rank in result["ranks"]]
    found = judge([rank[1] for rank in result["ranks"]], names, cfg.cluster.gate.busbw_gbps)[1]
    return (
        found,
        f"the gate's checks {where} found {', '.join(found)} slow"
        if found
        else f"the gate's checks {where} found no slow host",
    )
