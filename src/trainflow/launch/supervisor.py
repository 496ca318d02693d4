"""The hot restart on spare nodes (cluster.allocation.spare_nodes > 0): the job holds nodes + spare_nodes, and its one
task, the Supervisor, runs training as a job step on `nodes` of them; after a dead or hung rank it judges the failure
(resilience.verdict) and starts a new step on the healthy nodes plus a spare Slurm keeps in service and that starts a
task (a drained one is skipped: launch.slurm_nodes; so is one whose slurmd is dead: launch.steps.answering), the failed
node left out, which resumes from the newest verified checkpoint: no new job.

    python -m trainflow.stages.train_segment cluster.allocation.spare_nodes=1 fault.step=3 fault.signal=KILL

A step is a Slurm job step or, on one machine, a local job of the rank processes (launch.steps). Every step the
supervisor restarts is a line of the run's jobs ledger (JobRun.step, job_id <job>.<step>), and each new step's line
holds the seconds from the failure before it to its own first trained step (JobRun.first_step_s). A hang no rank's
evidence pins (a symmetric hang: a failed link or switch), a step lost with no node named, or an NCCL error no node
confirms, is checked where it happened: each of the step's hosts is tried with one task (a dead one is found so),
then a step of the gate's checks on the job's own hosts (launch.gate_job.checked) finds the slow host, which a spare
replaces, or none, and training restarts in the same job either way; a check that cannot run blames nobody. What
it does not restart it hands back to the stage (launch.segment_jobs), which judges it as a job's failure: a verdict of
no restart, and a restart once the spares are used up (a new job, as with no spares).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import submitit
from submitit.helpers import Checkpointable

from trainflow.config import TrainflowConfig
from trainflow.journal import Journal
from trainflow.launch.gate_job import checked
from trainflow.launch.job_end import LaunchError
from trainflow.launch.judgement import judgement, recorded
from trainflow.launch.peer_recovery import PeerRecovery
from trainflow.launch.restart import first_step_at, job_run
from trainflow.launch.slurm_nodes import node_states, usable_spares
from trainflow.launch.steps import LocalSteps, SrunSteps, Steps, answering
from trainflow.launch.task import configure_logging
from trainflow.resilience.ledger import NO_FAILURE, FaultClass, JobOutcome, JobRun, jobs_ledger
from trainflow.resilience.verdict import JobFailure, Verdict

log = logging.getLogger(__name__)

REQUEUE_WAIT_S = 300
"""How long a supervisor whose job was requeued waits for Slurm to end it (KillWait after the requeue's SIGTERM)."""


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
            fields = dict(attempt=attempt, submitted=submitted, exclude=self.exclude | left_out)
            peers = self.peers(steps, active, spares, ledger, fields, f"{job_id}.{index}")
            job = steps.launch(self.task(attempt), active, folder, peers.env if peers else None)
            try:
                results = (peers or steps).wait(job)
            except LaunchError as err:
                if err.failure is None:
                    raise
                run = self.step_run(job, index, job_id, failed_at, fields, err.failure, peers)
                if peers:  # the nodes its recoveries replaced are out; a refused one's failure is judged below
                    left_out |= set(active) - set(peers.hosts)
                    active, spares = peers.hosts, peers.spares
                if self.signalled and not err.failure.errors:  # the ranks stopped at the time limit, none raised
                    self.requeued(steps, run, ledger)
                # Slurm may have drained a spare meanwhile, or its slurmd died (which Slurm sees only later)
                spares = answering(steps, usable_spares(spares, node_states(a.executor)))
                check = functools.partial(probed, self.cfg, steps, active, base / f"{job_id}-check.{index}")
                verdict, why = self.verdict(err.failure, job, failures, [*ledger.read(), run], (active, spares), check)
                if why:
                    return Supervised(run, failure=err.failure, failures=failures, why=why)
                ledger.append(recorded(run, verdict))
                out = verdict.exclude & set(active)
                active, spares = swapped(active, spares, out)
                left_out, failures = left_out | out, [*failures, err.failure]
                log.warning("Hot restart %d (job step %s.%d): %s; %s", index + 1, job_id, index + 1, err, verdict.why)
                failed_at, submitted = run.ended, time.time()
                continue
            run = self.step_run(job, index, job_id, failed_at, fields, None, peers)
            return Supervised(run, results=results, failures=failures)

    def peers(
        self, steps: Steps, active: list[str], spares: list[str], ledger: Journal, fields: dict, name: str
    ) -> PeerRecovery | None:
        """A step's recovery from peers where resilience.recovery=peers (launch.peer_recovery), else None."""
        if self.cfg.resilience.recovery != "peers":
            return None
        return PeerRecovery(self.cfg, steps, list(active), list(spares), ledger, fields, name)

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
        peers: PeerRecovery | None = None,
    ) -> JobRun:
        """The ledger's record of step `index`, with its failure-to-first-step time after a hot restart (or, after a
        recovery from peers, its last generation's record)."""
        run = job_run(self.cfg, job, failure=failure, step=index, job_id=f"{job_id}.{index}", **fields)
        first = first_step_at(job)
        run = dataclasses.replace(run, first_step_s=first - failed_at if first and failed_at else None)
        return peers.last(run) if peers else run

    def verdict(
        self,
        failure: JobFailure,
        job: submitit.Job,
        failures: list,
        history: list[JobRun],
        hosts: tuple[list, list],
        check: Callable[[], tuple[list[str], str]],
    ) -> tuple[Verdict, str]:
        """The failure's verdict, and why the stage must act on it ('' where a hot restart follows); `hosts`: the
        step's and the spares that answer; `check`: the checks of the step's hosts (probed), run after a hang no
        rank's evidence pins, a step lost with no node named, or an NCCL error no node's evidence confirms
        (ncclSystemError, ncclRemoteError: a link, a switch)."""
        a, (active, spares) = self.cfg.cluster.allocation, hosts
        earlier = [*self.earlier, *failures]
        verdict = judgement(self.cfg, job, failure, earlier, history)
        symmetric = failure.kind == JobOutcome.HANG and failure.rank is None
        if verdict.restart and (symmetric or failure.kind == JobOutcome.LOST or verdict.fault is FaultClass.NETWORK):
            found, said = check()
            verdict = judgement(self.cfg, job, failure, earlier, history, slow=frozenset(found))
            verdict = dataclasses.replace(verdict, why=f"{verdict.why} ({said})")
        if not verdict.restart:
            return verdict, verdict.why
        if len(verdict.exclude & set(active)) > len(spares):
            return verdict, f"the job's {a.spare_nodes} spare node(s) are used up: a new job"
        return verdict, ""


def probed(cfg: TrainflowConfig, steps: Steps, hosts: list[str], folder: Path) -> tuple[list[str], str]:
    """The hosts of a failed step that cannot start a task (each tried at once: launch.steps), found without the
    gate's checks, which would not run on them; else the slow hosts the gate's checks find as a step on `hosts`."""
    if dead := steps.unanswered(hosts):
        first = next(iter(dead.values()))
        return sorted(dead), f"{', '.join(sorted(dead))} cannot start a task ({first})"
    return checked(cfg, steps, hosts, folder)


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
