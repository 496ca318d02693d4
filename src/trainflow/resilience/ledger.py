"""The run's jobs ledger (jobs.jsonl, beside the checkpoints: RunFolder.jobs_log): every job train_segment ran for
every segment and rerun, how it ended, the hosts its failure blamed and its verdict; the hosts' ledger (hosts.jsonl:
RunFolder.hosts_log) of what Slurm did with a blamed host since (resilience.probation); and where the run stands by
both, read at every segment start and rerun, so that excluded hosts and the restart budget outlive a segment and a
repaired host comes back.

    python -c "from trainflow.resilience.ledger import jobs_ledger, standing; \
        print(standing(jobs_ledger('runs/default/capacity/checkpoints/<series>').read()))"

Both are opened here alone (jobs_ledger, hosts_ledger), for every read and every append, in launch/, the stage and
trainflow.status alike.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from trainflow.config.run_folder import RunFolder
from trainflow.errors import TrainflowError
from trainflow.journal import Journal
from trainflow.records import Record, fields_added


class JobOutcome(StrEnum):
    """How a job of a segment ended (jobs.jsonl writes the value): completed, or the kind of its failure
    (resilience.verdict.JobFailure.kind, never COMPLETED)."""

    COMPLETED = "completed"
    HANG = "hang"
    """The job's own ranks found one hung (launch.heartbeat)."""
    STOPPED = "stopped"
    """Slurm or an operator ended the job (TIMEOUT, CANCELLED, NODE_FAIL...)."""
    DIED = "died"
    """A rank ended abruptly (a signal, os._exit, the OOM killer, a lost node)."""
    RAISED = "raised"
    """A rank's code raised."""
    LOST = "lost"
    """The job ended without every result and no rank to blame."""
    REQUEUED = "requeued"
    """A supervised job's step its ranks stopped at Slurm's pre-timeout signal, having saved and requeued the job
    (launch.supervisor): no failure, the requeued job's step resumes from that checkpoint."""


class FaultClass(StrEnum):
    """What a failed job's verdict took its failure for (resilience.verdict; jobs.jsonl writes the value; the table in
    docs/fault-tolerance.md names each class's test)."""

    INPUT = "input"
    """One of trainflow's own errors: the input fails again. Not restarted."""
    ENDED = "ended"
    """Slurm or an operator ended the job, or its requeues ran out. Not restarted."""
    MEMORY = "memory"
    """Out of device memory: restarted, no host blamed; at the same step twice, not restarted."""
    CODE = "code"
    """The same exception on every rank at once with no node's evidence (restarted once), or in two jobs: not again."""
    DEVICE = "device"
    """A device or interconnect error on a host whose own evidence (Xid, NVML, Slurm) confirms it: that host blamed."""
    UNCONFIRMED = "unconfirmed"
    """An exception (a CUDA error among them) no node's evidence confirms: restarted, no host blamed."""
    NETWORK = "network"
    """NCCL's errors (ncclSystemError, ncclRemoteError...) without node evidence: restarted, no host blamed."""
    TRANSIENT = "transient"
    """A store timeout or a file-system error: restarted, no host blamed, counted apart (Standing.transient)."""
    HOST = "host"
    """A rank died or hung with a culprit, or its node failed: its host blamed (no host known: none)."""


NO_FAILURE = (JobOutcome.COMPLETED, JobOutcome.REQUEUED)
"""The outcomes that are no failure (a tuple: `in` compares values, so a plain "completed" is found too)."""


@dataclass(frozen=True)
class JobRun(Record):
    """One job train_segment submitted for a segment, and how it ended (jobs.jsonl)."""

    FORMAT = 4
    MIGRATIONS = {1: fields_added, 2: fields_added, 3: fields_added}  # 2: fault; 3: parts; 4: generations

    segment: int
    attempt: int
    """0 for the segment's first job; a restart after a failure counts up."""
    job_id: str
    submitted: float
    started: float
    """The first rank's start (its task marker); `submitted` when none started."""
    ended: float
    """When the stage saw the job end."""
    outcome: JobOutcome
    line: str = ""
    """The failure's one line."""
    verdict: str = ""
    """Whether and how it was restarted (resilience.verdict), or why not."""
    exclude: list[str] = field(default_factory=list)
    """The hosts the job was submitted without (one machine: recorded, not applied)."""
    left_out: list[str] = field(default_factory=list)
    """The hosts its failure blames, which every later job of the run leaves out (resilience.ledger.standing)."""
    checkpoint: int = -1
    """The newest checkpoint's step when it ended (-1: none): a job that raised it made progress."""
    step: int | None = None
    """A hot restart's job step (launch.supervisor: 0 the allocation's first, each hot restart one more; job_id is then
    <job>.<step>; Slurm's own step id is one more, its step 0 being the supervisor); None: the record is a whole
    job's."""
    first_step_s: float | None = None
    """For a hot restart's step: seconds from the failure of the step before it (that step's `ended`, when the
    supervisor saw it end) to the end of this step's first trained step (spans.jsonl): the measured hot restart."""
    fault: FaultClass | None = None
    """What its verdict took the failure for (None: no failure, or judged before format 2 recorded it)."""
    parts: dict[str, float] = field(default_factory=dict)
    """Seconds of each part of its ranks' start-up (config.startup.StartupPart, by name, launch to first_step; each
    ended when its last rank ended it, from its task markers), the first from `submitted`: a hot restart's
    first_step_s is the supervisor's verdict (`submitted` less the step before's `ended`) and these. Empty before
    format 3, or where no rank recorded one."""
    generation: int = 0
    """Under resilience.recovery=peers, the generation of the step's process groups this line is (0 its first; each
    recovery from peers one more: launch.peer_recovery); the step's job_id is the same for all of them."""
    recovery: str = ""
    """How the failure before this line was recovered: "peers" (the survivors kept their processes, the failed node's
    ranks took their state from a live replica: launch.peers), "" for the job-level ways (a new job step or job)."""
    kept_pids: dict[str, int] = field(default_factory=dict)
    """After a recovery from peers: each surviving rank (as text) and the process id it kept."""
    checkpoint_bytes_read: int | None = None
    """After a recovery from peers: the bytes its ranks read from checkpoint files between the failure and the end of
    this line (0 where every state came from memory and replicas); None where not counted."""


class HostEventKind(StrEnum):
    """What Slurm did with a host on probation, or a health check of it found (hosts.jsonl writes the value)."""

    HELD = "held"
    """Slurm held it out of jobs (drained, down, failed, rebooting) after its blame: a repair began."""
    RETURNED = "returned"
    """It left probation: Slurm returned it to service after holding it, or it rebooted, or a health check of it
    passed, after its blame."""
    CHECKING = "checking"
    """A health check job of it was submitted (HostEvent.check_job; launch.health_check)."""
    CHECK_FAILED = "check failed"
    """Its health check found a fault or did not run: it stays out until its next check or Slurm's repair."""


@dataclass(frozen=True)
class HostEvent(Record):
    """A line of the run's hosts ledger (hosts.jsonl): Slurm's evidence about a blamed host, seen before a job."""

    host: str
    at: float
    """When the stage read it from Slurm."""
    kind: HostEventKind
    evidence: str
    """Slurm's state, reason and times, in one line."""
    blamed_by: str
    """The blame it answers: "job <id>", the job whose failure left the host out."""
    check_job: str = ""
    """A health check's Slurm job id (CHECKING, and the check's outcome); "" for Slurm's evidence."""


def jobs_ledger(checkpoints: str | Path) -> Journal[JobRun]:
    """The run's jobs ledger beside the checkpoint folder `checkpoints` (RunFolder.jobs_log)."""
    return Journal(RunFolder.jobs_log(str(checkpoints)), JobRun)


def hosts_ledger(checkpoints: str | Path) -> Journal[HostEvent]:
    """The run's hosts ledger beside the checkpoint folder `checkpoints` (RunFolder.hosts_log)."""
    return Journal(RunFolder.hosts_log(str(checkpoints)), HostEvent)


@dataclass(frozen=True)
class Probation:
    """A host the run leaves out: from its newest blame until it returns."""

    job: str
    """"job <id>": the job whose failure blamed it last."""
    since: float
    """When that job ended: only Slurm's evidence after it counts."""
    held: HostEvent | None = None
    """The newest hold Slurm was seen to put on it since."""


@dataclass(frozen=True)
class Standing:
    """Where the run stands, from its jobs ledger (every job of every segment and rerun, resilience.ledger.JobRun) and
    its hosts ledger (HostEvent)."""

    excluded: dict[str, Probation]
    """Each host the run leaves out now -> its probation (the job whose failure blamed it last)."""
    without_progress: int
    """The restarts in a row since a job last saved a newer checkpoint than any before it (or completed), but the
    transient ones."""
    returned: dict[str, HostEvent] = field(default_factory=dict)
    """Each host blamed and since returned (not blamed again after) -> its return."""
    transient: int = 0
    """The restarts after a transient failure (FaultClass.TRANSIENT) in the same run of restarts: counted apart."""


def standing(
    jobs: list[JobRun], events: Sequence[HostEvent] = (), gate: Mapping[str, Probation] | None = None
) -> Standing:
    """The run's excluded hosts, returned hosts and restarts without progress, from its jobs ledger in order, its
    hosts ledger (none in a run folder written before hosts came back: every blamed host then stays out) and the
    gate's blames (launch.restart.gate_blames: the hosts of nccl-exclude.txt since it was written)."""
    blamed: dict[str, Probation] = dict(gate or {})
    newest, streak = -1, []
    for job in jobs:
        for host in checked_hosts(job.left_out, f"the jobs ledger's job {job.job_id}"):
            if host not in blamed or job.ended >= blamed[host].since:  # the newest blame: a host may come back twice
                blamed[host] = Probation(f"job {job.job_id}", job.ended)
        if job.outcome in NO_FAILURE or job.checkpoint > newest:  # done, or it trained a checkpoint interval
            streak = []
        if job.outcome not in NO_FAILURE:
            streak.append(job)
        newest = max(newest, job.checkpoint)
    excluded, returned = probations(blamed, events)
    restarted = streak[:-1]  # the jobs each followed by a restart; the newest failure is still to be judged
    transient = sum(job.fault == FaultClass.TRANSIENT for job in restarted)
    return Standing(excluded, len(restarted) - transient, returned, transient)


def probations(
    blamed: dict[str, Probation], events: Sequence[HostEvent]
) -> tuple[dict[str, Probation], dict[str, HostEvent]]:
    """The blamed hosts still out (with the hold seen since their blame) and those returned since it."""
    since: dict[str, list[HostEvent]] = {}
    for event in events:
        checked_hosts([event.host], "the hosts ledger")
        if event.host in blamed and event.at >= blamed[event.host].since:
            since.setdefault(event.host, []).append(event)
    excluded, returned = {}, {}
    for host, probation in blamed.items():
        kinds = {e.kind: e for e in since.get(host, [])}  # the newest of each kind
        if HostEventKind.RETURNED in kinds:
            returned[host] = kinds[HostEventKind.RETURNED]
        else:
            excluded[host] = dataclasses.replace(probation, held=kinds.get(HostEventKind.HELD))
    return excluded, returned


def over_cap(excluded: frozenset[str], cap: int, ledger: Path) -> str | None:
    """Why the run stops before its next job, where it leaves out more hosts at once than resilience allows."""
    if len(excluded) <= cap:
        return None
    return (
        f"the run leaves out {len(excluded)} hosts at once ({', '.join(sorted(excluded))}), past "
        f"resilience.max_excluded_nodes ({cap}): have the site repair them (a host returns once Slurm has held it "
        f"out and put it back in service, or rebooted it, since its blame in {ledger}), or raise the cap"
    )


HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""A node name as sbatch --exclude takes it. Hosts come from files of the run folder (task markers, the hang report,
nccl-exclude.txt), which may be hostile: nothing else reaches the sbatch script."""


class HostError(TrainflowError):
    """A host name to leave out that is not one."""


def checked_hosts(hosts: list[str] | set[str] | frozenset[str], where: str) -> frozenset[str]:
    """`hosts`, each a node name (HOST); else one HostError naming the value and its file."""
    for host in hosts:
        if not isinstance(host, str) or not HOST.fullmatch(host):
            raise HostError(
                f"{where} names the host {host!r} to leave out, which is not a node name ([A-Za-z0-9._-], up to 63 "
                "characters); the file was altered: delete it"
            )
    return frozenset(hosts)
