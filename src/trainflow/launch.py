"""Launching distributed stages through submitit: LocalExecutor here, SlurmExecutor on a cluster.

The same callable runs under both; each task learns its rank, world size and master address from
`submitit.JobEnvironment` and initialises torch.distributed (gloo on CPU, NCCL on GPUs) with the
configured collective timeout, so a dead rank fails the job instead of hanging it.
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

import submitit
import torch
import torch.distributed as dist

from trainflow.config import ClusterConfig, TrainflowError

log = logging.getLogger("trainflow.launch")


class LaunchError(TrainflowError):
    """A distributed job that failed; the message names its log file."""


def build_executor(cluster: ClusterConfig, *, world_size: int, folder: str | Path, name: str) -> submitit.Executor:
    """An executor for one job of `world_size` tasks shaped by the cluster config."""
    tasks_per_node = world_size // cluster.nodes
    if cluster.executor == "local":
        executor = submitit.AutoExecutor(folder=folder, cluster="local")
        executor.update_parameters(timeout_min=cluster.time_min, tasks_per_node=tasks_per_node, nodes=1)
        return executor
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=cluster.max_requeues)
    params = dict(
        name=name,
        timeout_min=cluster.time_min,
        nodes=cluster.nodes,
        tasks_per_node=tasks_per_node,
        cpus_per_task=cluster.cpus_per_task,
        mem_gb=cluster.mem_gb,
        slurm_signal_delay_s=cluster.signal_delay_s,
        slurm_setup=list(cluster.setup),
    )
    if cluster.gpus_per_node:
        params["gpus_per_node"] = cluster.gpus_per_node
    for key, value in (("slurm_partition", cluster.partition), ("slurm_account", cluster.account),
                       ("slurm_constraint", cluster.constraint)):
        if value:
            params[key] = value
    executor.update_parameters(**params)
    return executor


def run_job(executor: submitit.Executor, fn: object) -> list:
    """Submit `fn`, wait, and return every task's result; a failure becomes one LaunchError line."""
    job = executor.submit(fn)
    log.info("Submitted %s job %s; logs in %s", type(executor).__name__, job.job_id, job.paths.folder)
    try:
        return job.results()
    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as err:
        last = next((line for line in reversed(str(err).splitlines()) if line.strip()), "no message")
        raise LaunchError(f"job {job.job_id} failed: {last.strip()} (full log: {job.paths.stderr})") from err


def init_distributed(cluster: ClusterConfig) -> tuple[int, int, torch.device]:
    """Rank, world size and device of this task; initialises the default process group."""
    os.environ.update(cluster.env)
    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    if cluster.device == "cuda":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = cluster.backend
    dist.init_process_group(
        backend=backend,
        timeout=datetime.timedelta(seconds=cluster.collective_timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    return env.rank, env.world_size, device
