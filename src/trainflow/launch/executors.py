"""The submitit executor of a job shaped by the Hydra `cluster` group, and the local executor whose
controller reports how each task ended (submitit's forgets).

    python -c "from trainflow.config import compose; from trainflow.launch import build_executor; \
        print(build_executor(compose('train_segment').cluster.allocation, world_size=2, folder='/tmp/j', name='x'))"
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import submitit
from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE, Controller, LocalJob, LocalJobEnvironment

from trainflow.config import AllocationConfig
from trainflow.launch.container import check_container, python_command, srun_args


def build_executor(
    allocation: AllocationConfig,
    *,
    world_size: int,
    folder: str | Path,
    name: str,
    exclude: Sequence[str] = (),
    supervised: bool = False,
) -> submitit.Executor:
    """An executor for one job of `world_size` tasks shaped by cluster.allocation, on no host of `exclude` (Slurm
    node names: a restart leaves out the failed job's bad hosts; one machine has no other host to go to). Supervised
    (launch.supervisor, cluster.allocation.spare_nodes): the job holds nodes + spare_nodes and runs one task, the
    supervisor, which starts the ranks itself as job steps; Slurm keeps the job when a node of it fails (--no-kill).

    A task that fails ends the others at once: srun's --kill-on-bad-exit on Slurm, LocalController here. Without it
    the ranks still running wait for the dead one until the collective timeout, and a stopped one forever."""
    tasks_per_node = world_size // allocation.nodes
    if allocation.executor == "local":
        executor = LocalExecutor(folder=folder)
        tasks = 1 if supervised else tasks_per_node
        executor.update_parameters(timeout_min=allocation.time_min, tasks_per_node=tasks, nodes=1)
        return executor
    check_container(allocation.container)
    executor = submitit.AutoExecutor(
        folder=folder,
        cluster="slurm",
        slurm_max_num_timeout=allocation.max_requeues,
        slurm_python=python_command(allocation, folder=folder),  # the container's interpreter, where there is one
    )
    srun = ["--nodes=1", "--ntasks=1"] if supervised else ["--kill-on-bad-exit=1"]  # the supervisor: one task
    params = dict(
        name=name,
        timeout_min=allocation.time_min,
        nodes=allocation.nodes + allocation.spare_nodes if supervised else allocation.nodes,
        tasks_per_node=tasks_per_node,
        cpus_per_task=allocation.cpus_per_task,
        mem_gb=allocation.mem_gb,
        slurm_signal_delay_s=allocation.signal_delay_s,
        slurm_srun_args=[*srun, *srun_args(allocation.container)],
    )
    if supervised:
        params["slurm_additional_parameters"] = {"no_kill": True}
    if exclude:
        params["slurm_exclude"] = ",".join(sorted(exclude))
    if allocation.setup:
        params["slurm_setup"] = list(allocation.setup)
    if allocation.gpus_per_node:
        params["gpus_per_node"] = allocation.gpus_per_node
    for key, value in (
        ("slurm_partition", allocation.partition),
        ("slurm_account", allocation.account),
        ("slurm_constraint", allocation.constraint),
    ):
        if value:
            params[key] = value
    executor.update_parameters(**params)
    return executor


KEEP_SURVIVORS = "TRAINFLOW_KEEP_SURVIVORS"
"""Set to 1 in a local job's controller where a task's end must leave the others running (recovery from peers)."""


class LocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, its jobs run by LocalController (`python -m trainflow.launch FOLDER`), with `env`
    added to their environment."""

    env: dict[str, str] = {}  # noqa: RUF012 (replaced per instance, never mutated)

    def _submit_command(self, command: str) -> LocalJob:
        # The environment submitit 1.5.4's start_controller gives its controller; only the program differs.
        tasks, gpus = self.parameters.get("tasks_per_node", 1), self.parameters.get("gpus_per_node", 0)
        env = {
            **os.environ,
            "SUBMITIT_EXECUTOR": "local",
            "SUBMITIT_LOCAL_COMMAND": command,
            "SUBMITIT_LOCAL_NTASKS": str(tasks),
            "SUBMITIT_LOCAL_NODEID": "0",
            "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
            "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * self.parameters.get("timeout_min", 2.0))),
            "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(self.parameters.get("signal_delay_s", 30))),
            "SUBMITIT_STDERR_TO_STDOUT": "",
            "SUBMITIT_LOCAL_WITH_SHELL": "",
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus))),
            **self.env,
        }
        process = subprocess.Popen([sys.executable, "-m", "trainflow.launch", str(self.folder)], env=env)
        return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(tasks)))


class LocalController(Controller):
    """submitit's local job controller, which also writes each task's abnormal end into the job's log, worded
    as srun does (submitit's forgets how its tasks ended): the first such line names the first death. As srun's
    --kill-on-bad-exit does, a task's abnormal end (not a requeue's exit) kills the others at once (SIGKILL: a
    stopped process receives nothing else), unless KEEP_SURVIVORS is set: recovery from peers (launch.peers) keeps
    them."""

    def wait(self, freq: int = 24) -> list[int | None]:
        """submitit's wait: USR2 signal_delay_s before the time limit; the exit codes once every task ended."""
        start, codes, warned = time.monotonic(), [None] * len(self.tasks), False
        keep = os.environ.get(KEEP_SURVIVORS) == "1"
        while time.monotonic() - start < self.timeout_s:
            for k, task in enumerate(self.tasks):
                if codes[k] is None and (code := task.poll()) is not None:
                    codes[k] = code
                    if code:
                        how = signal.strsignal(-code) if code < 0 else f"Exited with exit code {code}"
                        print(
                            f"trainflow-local: error: {socket.gethostname()}: task {k}: {how}",
                            file=self.stderrs[0],
                            flush=True,
                        )
                    if code and code != LOCAL_REQUEUE_RETURN_CODE and not keep:
                        self._forward_signal(signal.SIGKILL)
            if None not in codes:
                break
            if not warned and time.monotonic() - start >= self.timeout_s - self.signal_delay_s:
                self._forward_signal(LocalJobEnvironment._usr_sig())
                warned = True
            time.sleep(1 / freq)
        return codes
