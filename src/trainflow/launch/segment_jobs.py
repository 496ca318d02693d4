"""A training segment's jobs: submit, wait, judge a failure (resilience.verdict), restart on other hosts or stop in
one line, and keep each job in the run's jobs ledger; the stage (stages/train_segment.py) only wires it.

    python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=KILL   # a restart, drilled

Before each job: the hosts to leave out, the gate's and every one the run's ledger blames that Slurm has not
shown repaired since, nor a health check of its own passed (launch.slurm_nodes.on_probation, launch.health_check; at
most resilience.max_excluded_nodes at once) but those the stage excuses (the hosts of failures a drill injected,
fault.mtbf_s).
After a failure: its verdict, with the restarts in a row that made no progress (resilience.max_restarts); after a
hang whose evidence names nobody, the gate's checks on a new allocation first (launch.gate_job.slow_hosts), so no host
is left out on a guess. With cluster.allocation.spare_nodes the job is a launch.supervisor, which restarts inside its
allocation (a new job step on a spare) and hands back only what it does not restart: those failures are judged here as
a job's. A job a stage before this one submitted and left (its Snakemake died) is re-attached, never submitted
twice (launch.live_job).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

import submitit
from submitit.helpers import Checkpointable

from trainflow.checkpoint.folders import list_steps
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.launch.executors import build_executor
from trainflow.launch.gate_job import slow_hosts
from trainflow.launch.health_check import SlurmHealthChecks
from trainflow.launch.job_end import LaunchError, wait_job
from trainflow.launch.judgement import judgement, recorded
from trainflow.launch.live_job import LiveJobs
from trainflow.launch.restart import gate_blames, job_run
from trainflow.launch.slurm_nodes import node_states, on_probation
from trainflow.launch.supervisor import Supervised, Supervisor, submit_supervisor
from trainflow.resilience.ledger import JobOutcome, JobRun, jobs_ledger, over_cap
from trainflow.resilience.verdict import JobFailure

log = logging.getLogger(__name__)


def resume_point(cfg: TrainflowConfig) -> str:
    """Where a rerun of the segment starts: the newest checkpoint Trainer.resume looks for first."""
    end = (cfg.segment + 1) * cfg.train.segment_steps
    for root in filter(None, (cfg.io.checkpoints, cfg.io.resume_from)):
        if steps := [step for step in list_steps(Path(root)) if step <= end]:
            return f"rerunning the workflow resumes it from step {steps[-1]} (newest checkpoint in {root})"
    return f"{cfg.io.checkpoints} holds no checkpoint to resume it from"


def run_jobs(
    cfg: TrainflowConfig,
    task: Callable[[int], Checkpointable],
    excused: Callable[[list[JobRun]], frozenset[str]] = lambda jobs: frozenset(),
) -> list:
    """Every rank's result of the segment's job `task(attempt)`, restarting the job after a failure a new one may fix
    (resilience.verdict), each job in the run's jobs ledger, whose excluded hosts and restarts without progress carry
    over from earlier segments and reruns (resilience.ledger.standing). With cluster.allocation.spare_nodes the job is
    a launch.supervisor, which restarts inside its allocation first and hands back what it does not. `excused`: the
    hosts the ledger's jobs blame that later jobs may use again."""
    a, r, ledger = cfg.cluster.allocation, cfg.resilience, jobs_ledger(cfg.io.checkpoints)
    failures: list[JobFailure] = []
    live, left = LiveJobs(cfg), None
    if attached := live.attach():
        job, left = attached
    while True:
        if left is not None:  # the job a stage before this one submitted: waited for, not submitted again
            attempt, submitted, exclude = left.attempt, left.submitted, frozenset(left.exclude)
            left = None
        else:
            history, attempt = ledger.read(), len(failures)
            gate = gate_blames(RunFolder.of(cfg).nccl_exclude)
            checks = SlurmHealthChecks(cfg) if a.executor == "slurm" else None
            exclude = on_probation(cfg.io.checkpoints, history, node_states(a.executor), gate, checks)
            exclude -= excused(history)
            if why := over_cap(exclude, r.max_excluded_nodes, ledger.path):
                raise LaunchError(f"segment {cfg.segment} not started: {why}")
            submitted = time.time()
            job = submit(cfg, task, attempt, submitted, exclude, failures)
            live.submitted(job, attempt=attempt, submitted=submitted, exclude=exclude)
        try:
            results = wait_job(job, max_pending_s=r.max_pending_s, owned=live.mine)
        except LaunchError as err:
            live.check_mine(job)
            if err.failure is None:
                raise
            ran = job_run(cfg, job, attempt=attempt, submitted=submitted, exclude=exclude, failure=err.failure)
            try:
                failures.append(judged(cfg, job, ran, err.failure, failures, exclude, err))
            finally:
                live.clear()  # its end is in the ledger: no rerun re-attaches to it
            continue
        live.check_mine(job)
        if not a.spare_nodes:
            ledger.append(job_run(cfg, job, attempt=attempt, submitted=submitted, exclude=exclude, failure=None))
            live.clear()
            return results
        supervised: Supervised = results[0]
        failures += supervised.failures
        if supervised.failure is None:
            ledger.append(supervised.run)
            live.clear()
            return supervised.results
        log.warning("Segment %d: job %s handed back its failure: %s", cfg.segment, job.job_id, supervised.why)
        err = LaunchError(supervised.failure.line, supervised.failure)
        try:
            failures.append(judged(cfg, job, supervised.run, supervised.failure, failures, exclude, err))
        finally:
            live.clear()


def submit(
    cfg: TrainflowConfig,
    task: Callable[[int], Checkpointable],
    attempt: int,
    submitted: float,
    exclude: frozenset[str],
    failures: list[JobFailure],
) -> submitit.Job:
    """Submit the segment's next job: its ranks, or the supervisor that starts them (cluster.allocation.spare_nodes)."""
    a = cfg.cluster.allocation
    executor = build_executor(
        a,
        world_size=cfg.parallel.world_size,
        folder=cfg.io.submitit,
        name=f"{cfg.run}-train-{cfg.segment}",
        exclude=exclude if a.executor == "slurm" else (),  # one machine: recorded in the ledger, not applied
        supervised=a.spare_nodes > 0,
    )
    if a.spare_nodes:
        return submit_supervisor(executor, Supervisor(cfg, task, attempt, submitted, exclude, list(failures)))
    return executor.submit(task(attempt))


def judged(
    cfg: TrainflowConfig,
    job: submitit.Job,
    ran: JobRun,
    failure: JobFailure,
    failures: list[JobFailure],
    exclude: frozenset[str],
    err: LaunchError,
) -> JobFailure:
    """Judge a failed job (`ran`, its ledger record; `failures`, the segment's before it), record its verdict in the
    ledger, and return the failure where a new job follows; else one LaunchError line saying why not."""
    ledger = jobs_ledger(cfg.io.checkpoints)
    history = [*ledger.read(), ran]  # its newest checkpoint: whether it made progress
    verdict = judgement(cfg, job, failure, failures, history)
    if verdict.restart and failure.kind == JobOutcome.HANG and failure.rank is None:
        found, said = slow_hosts(cfg, exclude=sorted(exclude), name=f"{cfg.run}-check-{cfg.segment}")
        # a hang no rank's evidence pins: the gate's checks find the host, or none
        verdict = judgement(cfg, job, failure, failures, history, slow=frozenset(found))
        verdict = dataclasses.replace(verdict, why=f"{verdict.why} ({said})")
    ledger.append(recorded(ran, verdict))
    if not verdict.restart:
        raise LaunchError(f"segment {cfg.segment} failed: {err}; {verdict.why}; {resume_point(cfg)}") from err
    log.warning("Segment %d: %s; %s", cfg.segment, err, verdict.why)
    return failure
