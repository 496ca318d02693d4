"""Launching distributed stages through submitit: LocalExecutor here, SlurmExecutor on a cluster.

    python -m trainflow.stages.train_segment cluster=slurm_local parallel=dp2   # submits through here

The same callable runs under both; each task learns its rank, world size and master address from
`submitit.JobEnvironment` and initialises torch.distributed (gloo on CPU, NCCL on GPUs) with the
configured collective timeout, so a dead rank fails the job instead of hanging it. The job shape
(nodes, tasks and GPUs per node, partition, account, constraint, time limit, pre-timeout signal,
setup lines) is the Hydra `cluster` group; tests/slurm/golden/ holds the sbatch scripts it yields.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import signal
import threading
from collections.abc import Iterator
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
    )
    if cluster.setup:
        params["slurm_setup"] = list(cluster.setup)
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
    kind = getattr(executor, "cluster", type(executor).__name__)
    log.info("Submitted %s job %s (world size %d); logs in %s", kind, job.job_id, job.num_tasks, job.paths.folder)
    with cancel_on_interrupt(job, kind):
        try:
            return job.results()
        except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as err:
            raise LaunchError(f"{kind} job {job.job_id} failed: {failure_line(err)} (full log: {job.paths.stderr})") from err


def failure_line(error: Exception) -> str:
    """One line of a submitit error that says what went wrong."""
    lines = [line.strip() for line in str(error).splitlines()]
    ruler = "-" * 22  # FailedJobError: the task's traceback sits between two of these
    if lines.count(ruler) >= 2:
        start = lines.index(ruler)
        trace = [line for line in lines[start + 1:lines.index(ruler, start + 1)] if line]
        return trace[-1] if trace else "no traceback"
    # UncompletedJobError: no result file (killed, timed out, requeued too often); its state and the
    # last line of the task's error stream
    state = re.search(r"\(task: (\d+)\).*?\(state: (\w+)\)", " ".join(lines[:2]))
    last = next((line for line in reversed(lines[2:]) if line.strip("-")), "no error output")
    return f"task {state[1]} ended without a result (state {state[2]}): {last}" if state else lines[0]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def cancel_on_interrupt(job: submitit.Job, kind: str) -> Iterator[None]:
    """Cancel the job if the waiting process is stopped (Ctrl-C, or SIGTERM from Snakemake cancelling
    its local rule): an orphaned training job would keep writing the checkpoints a rerun writes too."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
    try:
        yield
    except KeyboardInterrupt:
        job.cancel(check=False)
        log.warning("Cancelled %s job %s: the stage waiting for it was interrupted", kind, job.job_id)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)  # None: a handler installed outside Python


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
