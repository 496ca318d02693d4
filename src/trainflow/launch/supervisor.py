"""The hot restart on spare nodes (cluster.allocation.spare_nodes > 0): the job holds nodes + spare_nodes, and its one
task, the Supervisor, runs training as a job step on `nodes` of them; after a dead or hung rank it judges the failure
(resilience.verdict) and starts a new step on the healthy nodes plus a spare Slurm keeps in service (a drained one is
skipped: launch.slurm_nodes), the failed node left out, which resumes from the newest verified checkpoint: no new job.

    python -m trainflow.stages.train_segment cluster.allocation.spare_nodes=1 fault.step=3 fault.signal=KILL

A step is a Slurm job step (srun --nodelist inside the allocation: SrunSteps) or, on one machine, a local job of the
rank processes the supervisor starts and waits for itself (LocalSteps: one host, so the host left out is only
recorded). Every step the supervisor restarts is a line of the run's jobs ledger (JobRun.step, job_id <job>.<step>),
and each new step's line holds the seconds from the failure before it to its own first trained step
(JobRun.first_step_s). What it does not restart it hands back to the stage (launch.segment_jobs), which judges it as
a job's failure: a verdict of no restart, a hang no rank's evidence pins (the gate's checks need a job of their own),
and a restart once the spares are used up (a new job, as with no spares).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

import submitit
from submitit.core.utils import cloudpickle_dump, pickle_load
from submitit.helpers import Checkpointable, DelayedSubmission

from trainflow.config import AllocationConfig, TrainflowConfig
from trainflow.host import hostname
from trainflow.journal import Journal
from trainflow.launch.container import python_command, srun_args
from trainflow.launch.executors import LocalExecutor
from trainflow.launch.failure import analyse
from trainflow.launch.job_end import LaunchError, show_job, wait_job
from trainflow.launch.judgement import judgement, recorded
from trainflow.launch.restart import first_step_at, job_run
from trainflow.launch.slurm_nodes import node_states, usable_spares
from trainflow.launch.task import MASTER_ADDR, configure_logging
from trainflow.resilience.ledger import NO_FAILURE, JobOutcome, JobRun, jobs_ledger
from trainflow.resilience.verdict import JobFailure, Verdict

log = logging.getLogger(__name__)

REQUEUE_WAIT_S = 300
"""How long a supervisor whose job was requeued waits for Slurm to end it (KillWait after the requeue's SIGTERM)."""


class Steps(Protocol):
    """How the supervisor starts and waits for a step of training ranks on some of the allocation's hosts."""

    def hosts(self) -> list[str]:
        """The allocation's hosts, in order."""

    def launch(self, task: Checkpointable, hosts: list[str], folder: Path) -> submitit.Job:
        """Start the task's ranks on `hosts`, its files in `folder`."""

    def wait(self, job: submitit.Job) -> list:
        """Every rank's result; a LaunchError holding the failure otherwise."""

    def requeue(self) -> str:
        """After the time limit's signal, once a step's ranks stopped without a result: make sure the job is requeued
        (its rank 0 does it, having saved); how, in words. A LaunchError where it cannot be."""


@dataclass
class LocalSteps:
    """One machine: each step is a local job of the ranks' processes (executors.LocalExecutor)."""

    allocation: AllocationConfig
    world_size: int

    def hosts(self) -> list[str]:
        return [hostname()] * (self.allocation.nodes + self.allocation.spare_nodes)

    def launch(self, task: Checkpointable, hosts: list[str], folder: Path) -> submitit.Job:
        executor = LocalExecutor(folder=folder)
        executor.update_parameters(timeout_min=self.allocation.time_min, tasks_per_node=self.world_size, nodes=1)
        return executor.submit(task)

    def wait(self, job: submitit.Job) -> list:
        return wait_job(job)

    def requeue(self) -> str:
        raise LaunchError(
            "a local job's supervisor is not requeued at its time limit: raise cluster.allocation.time_min"
        )


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

    def launch(self, task: Checkpointable, hosts: list[str], folder: Path) -> submitit.Job:
        folder.mkdir(parents=True, exist_ok=True)
        job = submitit.SlurmJob(folder, os.environ["SLURM_JOB_ID"], tasks=range(self.world_size))
        delayed = DelayedSubmission(task)
        # The ranks own the requeue at the time limit (rank 0's submitit handler): the requeues the job has left.
        requeues = self.allocation.max_requeues - int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        delayed.set_timeout(self.allocation.time_min, requeues)
        cloudpickle_dump(delayed, job.paths.submitted_pickle)
        python = python_command(self.allocation, folder=folder) or shlex.quote(sys.executable)
        command = [
            *("srun", "--unbuffered", "--overlap", "--kill-on-bad-exit=1", "--open-mode=append"),
            *(f"--nodes={len(hosts)}", f"--ntasks={self.world_size}", f"--nodelist={','.join(hosts)}"),
            f"--ntasks-per-node={self.world_size // len(hosts)}",
            *(f"--output={folder}/%j_%t_log.out", f"--error={folder}/%j_%t_log.err"),
            *srun_args(self.allocation.container),
            *shlex.split(python),
            *("-u", "-m", "submitit.core._submit", str(folder)),
        ]
        log.info("Started job step on %s: %s", ",".join(hosts), shlex.join(command))
        with open(job.paths.stderr, "ab") as err:  # srun's own lines (a task's end: launch.failure) beside rank 0's
            self.process = subprocess.Popen(command, stdout=err, stderr=err, env={**os.environ, MASTER_ADDR: hosts[0]})
        return job

    def wait(self, job: submitit.Job) -> list:
        code = self.process.wait()
        paths = [job.task(k).paths.result_pickle for k in range(job.num_tasks)]
        outcomes = [pickle_load(path) if path.exists() else None for path in paths]
        if all(outcome and outcome[0] == "success" for outcome in outcomes):
            return [outcome[1] for outcome in outcomes]
        failure = analyse(job, "slurm", ("", 0), outcomes)
        log.warning("Job step %s ended (srun exit status %d): %s", job.paths.folder.name, code, failure.line)
        raise LaunchError(failure.line, failure)

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


@dataclass(frozen=True)
class Supervised:
    """What the supervisor hands the stage: the results of the step that completed, or a failure to judge as a job's
    (a new job, or the stage's end), with the ledger's record of that last step."""

    run: JobRun
    """The last step's record (its verdict left to the stage)."""
    results: list | None = None
    failure: JobFailure | None = None
    failures: list[JobFailure] = dataclasses.field(default_factory=list)
    """The failures the supervisor restarted itself, in order (the stage's earlier failures for its next verdict)."""
    why: str = ""
    """Why the failure was handed back."""


@dataclass
class Supervisor:
    """The job's one task where cluster.allocation.spare_nodes > 0: the segment's training steps, hot restarted."""

    cfg: TrainflowConfig
    task: Callable[[int], Checkpointable]
    """The ranks' task of the segment's job `attempt` (attempt counts the segment's failures, steps included)."""
    attempt: int
    submitted: float
    """When the stage submitted the job: the first step's record counts the queue wait from it."""
    exclude: frozenset[str]
    """The hosts the job was submitted without."""
    earlier: list[JobFailure]
    """The segment's failures before this job."""

    def __call__(self) -> Supervised:
        configure_logging()  # its info lines too (a step's start, the time limit's signal)
        self.signalled = False
        signal.signal(signal.SIGUSR2, self.leave_to_ranks)
        a, world = self.cfg.cluster.allocation, self.cfg.parallel.world_size
        steps: Steps = LocalSteps(a, world) if a.executor == "local" else SrunSteps(a, world)
        ledger, base = jobs_ledger(self.cfg.io.checkpoints), Path(self.cfg.io.submitit)
        job_id, failures, failed_at = submitit.JobEnvironment().job_id, [], None
        # A requeued job's steps follow its earlier ones (each in its own folder), without the hosts they left out,
        # and the first is queued from the requeue (the earlier step's end).
        before = [r for r in ledger.read() if r.step is not None and r.job_id.rpartition(".")[0] == job_id]
        before = [r for r in before if r.ended >= self.submitted]
        left_out = {h for r in before for h in r.left_out}
        active, spares = allocated(steps.hosts(), a.nodes, left_out)
        submitted, first = max([self.submitted, *(r.ended for r in before)]), len(list(base.glob(f"{job_id}.*")))
        attempts = self.attempt + sum(r.outcome not in NO_FAILURE for r in before)
        for index in itertools.count(first):
            folder, attempt = base / f"{job_id}.{index}", attempts + len(failures)
            job = steps.launch(self.task(attempt), active, folder)
            fields = dict(attempt=attempt, submitted=submitted, exclude=self.exclude | left_out)
            try:
                results = steps.wait(job)
            except LaunchError as err:
                if err.failure is None:
                    raise
                run = self.step_run(job, index, job_id, failed_at, fields, err.failure)
                if self.signalled and not err.failure.errors:  # the ranks stopped at the time limit, none raised
                    self.requeued(steps, run, ledger)
                spares = usable_spares(spares, node_states(a.executor))  # Slurm may have drained one meanwhile
                verdict, why = self.verdict(err.failure, job, failures, [*ledger.read(), run], (active, spares))
                if why:
                    return Supervised(run, failure=err.failure, failures=failures, why=why)
                ledger.append(recorded(run, verdict))
                out = verdict.exclude & set(active)
                active, spares = swapped(active, spares, out)
                left_out, failures = left_out | out, [*failures, err.failure]
                log.warning("Hot restart %d (job step %s.%d): %s; %s", index + 1, job_id, index + 1, err, verdict.why)
                failed_at, submitted = run.ended, time.time()
                continue
            run = self.step_run(job, index, job_id, failed_at, fields, None)
            return Supervised(run, results=results, failures=failures)

    def leave_to_ranks(self, signum: int, frame: object) -> None:
        """The supervisor's USR2 (Slurm's pre-timeout signal reaches every step): the ranks agree, save, and rank 0
        requeues the job, whose requeued supervisor starts a step from that checkpoint; submitit's handler would end
        the job here, the supervisor being no checkpointable task, before the ranks had saved. A step that ends after
        it without a rank's error is the time limit's, not a failure to restart."""
        self.signalled = True
        log.info("Caught %s: the ranks save and requeue the job", signal.Signals(signum).name)

    def requeued(self, steps: Steps, run: JobRun, ledger: Journal) -> NoReturn:
        """Record the step the time limit stopped (its ranks saved) as requeued, and wait for Slurm to end the job."""
        how = steps.requeue()
        line = f"the time limit's signal stopped the ranks (newest checkpoint: step {run.checkpoint}); {how}"
        ledger.append(dataclasses.replace(run, outcome=JobOutcome.REQUEUED, line=line, verdict="requeued by Slurm"))
        log.info("Recorded job step %s as requeued: %s", run.job_id, line)
        time.sleep(REQUEUE_WAIT_S)
        raise LaunchError(f"job step {run.job_id} was requeued but Slurm did not end it in {REQUEUE_WAIT_S} s")

    def step_run(
        self,
        job: submitit.Job,
        index: int,
        job_id: str,
        failed_at: float | None,
        fields: dict,
        failure: JobFailure | None,
    ) -> JobRun:
        """The ledger's record of step `index`, with its failure-to-first-step time after a hot restart."""
        run = job_run(self.cfg, job, failure=failure, step=index, job_id=f"{job_id}.{index}", **fields)
        first = first_step_at(job)
        return dataclasses.replace(run, first_step_s=first - failed_at if first and failed_at else None)

    def verdict(
        self, failure: JobFailure, job: submitit.Job, failures: list, history: list[JobRun], hosts: tuple[list, list]
    ) -> tuple[Verdict, str]:
        """The failure's verdict, and why the stage must act on it ('' where a hot restart follows); `hosts`: the
        step's and the spares."""
        a, (active, spares) = self.cfg.cluster.allocation, hosts
        verdict = judgement(self.cfg, job, failure, [*self.earlier, *failures], history)
        if not verdict.restart:
            return verdict, verdict.why
        if failure.kind == JobOutcome.HANG and failure.rank is None:
            return verdict, "a hang no rank's evidence pins: the gate's checks run first, in a job of their own"
        if len(verdict.exclude & set(active)) > len(spares):
            return verdict, f"the job's {a.spare_nodes} spare node(s) are used up: a new job"
        return verdict, ""


def allocated(hosts: list[str], nodes: int, left_out: set[str]) -> tuple[list[str], list[str]]:
    """The first step's hosts and the spares, without the hosts an earlier step of the job left out (a requeued job
    may be given them again); one LaunchError where too few are left."""
    healthy = [h for h in hosts if h not in left_out]
    if len(healthy) < nodes:
        raise LaunchError(f"the job's hosts {','.join(hosts)} hold {len(healthy)} not left out, fewer than {nodes}")
    return healthy[:nodes], healthy[nodes:]


def swapped(active: list[str], spares: list[str], out: set[str]) -> tuple[list[str], list[str]]:
    """The next step's hosts and the spares left, once the hosts `out` are left out: each replaced by the next spare,
    the step's order kept (its first host serves the rendezvous)."""
    given = iter(spares[: len(out)])
    return [next(given) if h in out else h for h in active], spares[len(out) :]


def submit_supervisor(executor: submitit.Executor, supervisor: Supervisor) -> submitit.Job:
    """Submit the supervisor as the job's one task (submitit counts the allocation's nodes x tasks_per_node)."""
    job = executor.submit(supervisor)
    return job if job.num_tasks == 1 else submitit.SlurmJob(executor.folder, job.job_id, tasks=(0,))
