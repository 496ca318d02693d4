"""Launching distributed stages through submitit: LocalExecutor here, SlurmExecutor on a cluster.

    python -m trainflow.stages.train_segment cluster=slurm_local parallel=dp2   # submits through here

The same callable runs under both; each task learns its rank, world size and master address from
`submitit.JobEnvironment` and initialises torch.distributed (gloo on CPU, NCCL on GPUs) with the
configured collective timeout, so a dead rank fails the job instead of hanging it (task.py). The
job shape (nodes, tasks and GPUs per node, partition, account, constraint, time limit, pre-timeout
signal, setup lines) is the Hydra `cluster` group (executors.py; tests/slurm/golden/ holds the sbatch
scripts it yields). A job that ends without every task's result fails in one line naming the
likeliest cause, after a bounded wait (job_end.py).
"""

from trainflow.launch.executors import build_executor
from trainflow.launch.job_end import LaunchError, cancel_on_interrupt, run_job, wait_job
from trainflow.launch.task import distributed_task

__all__ = ["LaunchError", "build_executor", "cancel_on_interrupt", "distributed_task", "run_job", "wait_job"]
