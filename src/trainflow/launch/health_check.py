"""The health check of a host on probation (resilience.probation): a job of its own on that node alone, which returns
the host where it passes, without waiting for Slurm's repair of a node that may never have been broken.

    python -m pytest tests/slurm/test_probation_on_slurm.py -k health

Each of the node's ranks (cluster.allocation's tasks per node) runs what a fault on that node would fail: the gate's
all_reduce sweep among the node's ranks (a wrong sum fails it; its bus bandwidth is held to the gate's tp_all_reduce
threshold where the layout's tp groups fit in a node, the one pattern that runs inside a node), a matmul on its device
against a float64 CPU reference (a silently corrupting device, which no collective notices), and the node's own
evidence (launch.node_report: a device Xid in the kernel log since the check began, NVML's health). It runs beside
training: submitted at one job start, read at a later one, never waited for.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError, pickle_load

from trainflow.config import TrainflowConfig, TrainflowError
from trainflow.gate.patterns import sweep
from trainflow.host import hostname
from trainflow.launch.executors import build_executor
from trainflow.launch.failure import exception_line
from trainflow.launch.job_end import job_state
from trainflow.launch.node_report import kernel_log, nvml_health
from trainflow.launch.task import distributed_task
from trainflow.resilience.evidence import kernel_faults

log = logging.getLogger(__name__)

MATMUL_SIZE = 1024
MATMUL_TOLERANCE = 1e-3
"""The largest relative error (Frobenius norm) of the device's fp32 matmul of two 1024 x 1024 normal matrices
against float64 on the CPU: fp32 rounding gives ~1e-7, TF32 (Hopper's default for fp32 matmuls where enabled) ~5e-4;
a flipped exponent bit gives >= 1."""


@dataclass(frozen=True)
class RankHealth:
    """What one rank of the check found (the job's result, by rank)."""

    host: str
    busbw_gbps: float | None
    """The in-node all_reduce's bus bandwidth at the largest cluster.gate.sweep_mb; None with one rank a node."""
    matmul_error: float
    fault: str
    """What failed on this rank, in one clause ('' where nothing did)."""


class HealthCheck:
    """The submitit task of the check (the module docstring)."""

    def __init__(self, cfg: TrainflowConfig) -> None:
        self.cfg = cfg

    def __call__(self) -> list[RankHealth]:
        import torch.distributed as dist

        gate = self.cfg.cluster.gate
        with distributed_task(self.cfg.cluster.runtime) as (_, world, device, _):
            began, fault, busbw = time.time(), "", None
            try:
                if world > 1:
                    busbw = sweep(gate.sweep_mb, iters=gate.sweep_iters, device=device)[-1].busbw_gbps
            except TrainflowError as err:
                fault = str(err)
            error = matmul_error(device)
            kernel, _ = kernel_log()
            nvml, nvml_fault = nvml_health()
            xids = kernel_faults(kernel, since=began)
            fault = fault or (f"NVML: {nvml}" if nvml_fault else f"kernel log: {xids[-1]}" if xids else "")
            mine = RankHealth(hostname(), busbw, error, fault)
            everyone: list = [None] * world
            dist.all_gather_object(everyone, mine)
        return everyone


def matmul_error(device) -> float:
    """The relative error of a fixed fp32 matmul on `device` against float64 on the CPU."""
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=g) for _ in range(2))
    reference = a.double() @ b.double()
    got = (a.to(device) @ b.to(device)).double().cpu()
    return float(torch.linalg.norm(got - reference) / torch.linalg.norm(reference))


def verdict(cfg: TrainflowConfig, host: str, ranks: list[RankHealth]) -> tuple[bool, str]:
    """Whether the check of `host`, whose ranks found `ranks`, passed, and what it found in one clause."""
    if any(r.host != host for r in ranks):
        return False, f"ran on {', '.join(sorted({r.host for r in ranks}))}, not {host}"
    if failed := next((r for r in ranks if r.fault), None):
        return False, f"failed: {failed.fault[:200]}"
    if (worst := max(r.matmul_error for r in ranks)) > MATMUL_TOLERANCE:
        return False, f"failed: a matmul's relative error {worst:.2g} > {MATMUL_TOLERANCE:g} against the CPU's"
    said = f"passed: {len(ranks)} rank(s), matmul error <= {worst:.2g}"
    speeds = [r.busbw_gbps for r in ranks if r.busbw_gbps is not None]
    if not speeds:
        return True, said
    slowest, p = min(speeds), cfg.parallel
    floor = cfg.cluster.gate.busbw_gbps.get("tp_all_reduce")
    if floor and p.tp > 1 and p.tp <= len(ranks) and slowest < floor:
        return False, f"failed: in-node all_reduce at {slowest:.3g} GB/s, below the gate's tp_all_reduce {floor:g}"
    return True, f"{said}, in-node all_reduce {slowest:.3g} GB/s"


@dataclass
class SlurmHealthChecks:
    """resilience.probation.HealthChecks on the cluster: each check a Slurm job on its host alone, its files under
    io.submitit/health."""

    cfg: TrainflowConfig

    @property
    def after_s(self) -> float:
        return self.cfg.resilience.health_check_after_s

    @property
    def folder(self) -> Path:
        return Path(self.cfg.io.submitit) / "health"

    def submit(self, host: str) -> str:
        a = self.cfg.cluster.allocation
        one_node = dataclasses.replace(a, nodes=1, spare_nodes=0)
        executor = build_executor(
            one_node, world_size=self.cfg.parallel.world_size // a.nodes, folder=self.folder, name=f"health-{host}"
        )
        executor.update_parameters(slurm_additional_parameters={"nodelist": host})
        try:
            job = executor.submit(HealthCheck(self.cfg))
        except (OSError, subprocess.SubprocessError, FailedJobError) as err:
            log.warning("Could not submit the health check of %s: %s", host, err)
            return ""
        log.info("Submitted the health check of %s: job %s", host, job.job_id)
        return str(job.job_id)

    def outcome(self, host: str, job_id: str) -> tuple[bool, str] | None:
        ended, _ = job_state(submitit.SlurmJob(self.folder, job_id), "slurm")  # None: it runs, or scontrol did not say
        if ended is None:
            return None
        result = self.folder / f"{job_id}_0_result.pkl"
        if not result.exists():
            return False, f"ended {ended[0]} without a result"
        outcome = pickle_load(result)  # submitit's ("success", ranks) or ("error", traceback)
        if outcome[0] != "success":
            return False, f"raised {exception_line(outcome[1])[:200]}"
        return verdict(self.cfg, host, outcome[1])
