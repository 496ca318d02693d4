"""How the hot-restart supervisor (launch.supervisor) starts a step of ranks on some of its allocation's hosts and
waits for it: a Slurm job step (srun --nodelist inside the allocation: SrunSteps) or, on one machine, a local job of
the rank processes (LocalSteps: one host, so a host left out is only recorded). A step runs any submitit task: the
segment's training ranks, or the gate's checks of the job's own nodes (launch.gate_job.checked).

    python -m trainflow.stages.train_segment cluster.allocation.spare_nodes=1 fault.step=3 fault.signal=KILL
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import submitit
from submitit.core.utils import cloudpickle_dump
from submitit.helpers import DelayedSubmission

from trainflow.config import AllocationConfig
from trainflow.host import hostname
from trainflow.launch.container import python_command, srun_args
from trainflow.launch.executors import KEEP_SURVIVORS, LocalExecutor
from trainflow.launch.job_end import LaunchError, show_job, task_results, wait_job
from trainflow.launch.task import MASTER_ADDR

log = logging.getLogger(__name__)

PROBE_S = 60
"""How long a spare may take to run one task before a step is put on it: a live node's slurmd starts it in ~0.04 s on
the local cluster, and srun gives up on a dead one's in ~11 s (2026-12-05: "Communication connection failure")."""


class Steps(Protocol):
    """How the supervisor starts and waits for a step of training ranks on some of the allocation's hosts."""

    def hosts(self) -> list[str]:
        """The allocation's hosts, in order."""

    def launch(
        self, task: Callable[[], object], hosts: list[str], folder: Path, peers: dict[str, str] | None = None
    ) -> submitit.Job:
        """Start the task's ranks on `hosts`, its files in `folder`; `peers`: the variables of a recovery from peers
        (launch.peer_recovery), whose ranks outlive a rank's end."""

    def wait(self, job: submitit.Job) -> list:
        """Every rank's result; a LaunchError holding the failure otherwise."""

    def requeue(self) -> str:
        """After the time limit's signal, once a step's ranks stopped without a result: make sure the job is requeued
        (its rank 0 does it, having saved); how, in words. A LaunchError where it cannot be."""

    def unanswered(self, hosts: list[str]) -> dict[str, str]:
        """The hosts of `hosts` that cannot start a task, each with why (its slurmd dead or unreachable, which Slurm
        notices only after its SlurmdTimeout)."""


def answering(steps: Steps, spares: list[str]) -> list[str]:
    """The spares that start a task, in order; each one that does not is skipped in one line (a step put on it would
    fail to start, and a restart on the same hosts fail again)."""
    dead = steps.unanswered(spares) if spares else {}
    for host, why in dead.items():
        log.warning("Skipped the spare %s: it cannot start a task (%s)", host, why)
    return [h for h in spares if h not in dead]


@dataclass
class LocalSteps:
    """One machine: each step is a local job of the ranks' processes (executors.LocalExecutor)."""

    allocation: AllocationConfig
    world_size: int

    def hosts(self) -> list[str]:
        return [hostname()] * (self.allocation.nodes + self.allocation.spare_nodes)

    def launch(
        self, task: Callable[[], object], hosts: list[str], folder: Path, peers: dict[str, str] | None = None
    ) -> submitit.Job:
        executor = LocalExecutor(folder=folder)
        executor.env = {**peers, KEEP_SURVIVORS: "1"} if peers else {}
        executor.update_parameters(timeout_min=self.allocation.time_min, tasks_per_node=self.world_size, nodes=1)
        return executor.submit(task)

    def wait(self, job: submitit.Job) -> list:
        return wait_job(job)

    def requeue(self) -> str:
        raise LaunchError(
            "a local job's supervisor is not requeued at its time limit: raise cluster.allocation.time_min"
        )

    def unanswered(self, hosts: list[str]) -> dict[str, str]:
        return {}  # this machine runs the supervisor


@dataclass
class SrunSteps:
    """Slurm: each step is `srun --nodelist=<hosts>` inside the job's allocation, running submitit's task entry point
    on a folder of the step's own (its ranks' results, markers and logs)."""

    allocation: AllocationConfig
    world_size: int
    process: subprocess.Popen | None = None

    def hosts(self) -> list[str]:
        command = ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()

    def launch(
        self, task: Callable[[], object], hosts: list[str], folder: Path, peers: dict[str, str] | None = None
    ) -> submitit.Job:
        folder.mkdir(parents=True, exist_ok=True)
        job = submitit.SlurmJob(folder, os.environ["SLURM_JOB_ID"], tasks=range(self.world_size))
        delayed = DelayedSubmission(task)
        # The ranks own the requeue at the time limit (rank 0's submitit handler): the requeues the job has left.
        requeues = self.allocation.max_requeues - int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        delayed.set_timeout(self.allocation.time_min, requeues)
        cloudpickle_dump(delayed, job.paths.submitted_pickle)
        module = ["submitit.core._submit", str(folder)]
        logs = f"{folder}/%j_%t_log"
        command = srun_step(self.allocation, hosts, self.world_size, folder, logs=logs, module=module, keep=bool(peers))
        log.info("Started job step on %s: %s", ",".join(hosts), shlex.join(command))
        with open(job.paths.stderr, "ab") as err:  # srun's own lines (a task's end: launch.failure) beside rank 0's
            env = {**os.environ, MASTER_ADDR: hosts[0], **(peers or {})}
            self.process = subprocess.Popen(command, stdout=err, stderr=err, env=env)
        return job

    def wait(self, job: submitit.Job) -> list:
        code = self.process.wait()
        try:
            return task_results(job, "slurm")
        except LaunchError as err:
            log.warning("Job step %s ended (srun exit status %d): %s", job.paths.folder.name, code, err)
            raise

    def requeue(self) -> str:
        """Nothing where Slurm counts a restart more than this job's run (rank 0 requeued it); else `scontrol requeue`
        (its ranks died before their handler, or stopped after it without a rank 0 to requeue)."""
        job, count = os.environ["SLURM_JOB_ID"], int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if (restarts := re.search(r"\bRestarts=(\d+)", show_job(job).stdout)) and int(restarts.group(1)) > count:
            return "its rank 0 requeued the job"
        if count >= self.allocation.max_requeues:
            raise LaunchError(
                f"job {job} reached its time limit with its {count} requeue(s) used up "
                f"(cluster.allocation.max_requeues={self.allocation.max_requeues}): raise it or time_min"
            )
        subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=True)
        return "the supervisor requeued the job (its ranks had not)"

    def unanswered(self, hosts: list[str]) -> dict[str, str]:
        """One task (`true`) on each host as a step of the job, all at once, each given PROBE_S."""
        probes = {
            host: subprocess.Popen(
                ["srun", "--overlap", "--quiet", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "true"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for host in hosts
        }
        deadline, dead = time.monotonic() + PROBE_S, {}
        for host, probe in probes.items():
            try:
                _, err = probe.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                probe.kill()
                probe.communicate()
                dead[host] = f"srun started no task on it in {PROBE_S} s"
                continue
            if probe.returncode:
                said = [line.removeprefix("srun: error: ") for line in err.splitlines() if line.startswith("srun: ")]
                dead[host] = said[0] if said else f"srun exit status {probe.returncode}"
        return dead


def srun_step(
    allocation: AllocationConfig,
    hosts: list[str],
    ntasks: int,
    folder: Path,
    *,
    logs: str,
    module: list[str],
    keep: bool = False,
) -> list[str]:
    """srun of `python -m <module>` as a step of `ntasks` tasks on `hosts` inside the job's allocation (the
    container's interpreter where there is one), their output in `logs`.out and .err. A task's abnormal end ends the
    others (--kill-on-bad-exit), unless `keep`: recovery from peers (launch.peer_recovery) keeps them after a task's
    end or its node's failure (--no-kill)."""
    python = python_command(allocation, folder=folder) or shlex.quote(sys.executable)
    return [
        *("srun", "--unbuffered", "--overlap", "--open-mode=append"),
        *(("--kill-on-bad-exit=0", "--no-kill") if keep else ("--kill-on-bad-exit=1",)),
        *(f"--nodes={len(hosts)}", f"--ntasks={ntasks}", f"--nodelist={','.join(hosts)}"),
        f"--ntasks-per-node={ntasks // len(hosts)}",
        *(f"--output={logs}.out", f"--error={logs}.err"),
        *srun_args(allocation.container),
        *shlex.split(python),
        *("-u", "-m", *module),
    ]
