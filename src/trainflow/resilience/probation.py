"""Exclusions with a way back: a host a failure blamed stays out of the run's jobs (resilience.ledger.standing) until
Slurm shows it repaired, read before every job from Slurm's own record of the node (`scontrol show node -o`).

    events = review(jobs, events, nodes, time.time())   # each a line of hosts.jsonl (resilience.ledger.HostEvent)

Slurm's evidence is the way back, as a site repairs a node: it drains it (or Slurm marks it down), fixes it and
resumes it, or reboots it. A host returns once Slurm has rebooted it since its blame, or once it is in service
again after a hold the stage saw since its blame (HELD, recorded the first time a review finds it drained, down,
failed or rebooting). A host Slurm kept in service and never rebooted is not repaired, however long ago its blame was;
a hold that began and ended between two reviews (every job start: each segment, each restart) is not seen, and the
host then waits for its next hold or reboot. The gate's hosts (nccl-exclude.txt, blamed when the file was written) come
back the same way.

A health check is the other way back, for a host Slurm keeps in service (a blame on a guess: a healthy node the rank
of a hang ran on, a node a kernel bug's error was taken for): resilience.health_check_after_s after its blame, a job
of its own on that node alone (`checks`: launch.health_check.SlurmHealthChecks) runs the gate's in-node collectives,
a matmul against a CPU reference and reads the node's own evidence; the host returns where all pass (RETURNED, the
job's finding as evidence), and is checked again that long after a check that failed (CHECK_FAILED). A check runs
beside training: it is submitted at one review (CHECKING, its job id) and read at a later one. A drained node is never
checked (its job would wait for the repair that returns it anyway).

`nodes` is the one way Slurm is asked (launch.slurm_nodes reads scontrol; a test gives the states it needs), and its
output is parsed strictly here: anything that is not scontrol's record of a node asked for is one SlurmNodesError line.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from trainflow.errors import TrainflowError
from trainflow.resilience.ledger import HOST, HostEvent, HostEventKind, JobRun, Probation, standing

SLURM_TIME = "%Y-%m-%dT%H:%M:%S"
"""Slurm's standard time format (its local time): scontrol is run with SLURM_TIME_FORMAT=standard."""
IN_SERVICE = frozenset({"IDLE", "MIXED", "ALLOCATED"})
"""Node states (scontrol's State, before any +FLAG) in which Slurm gives the node jobs."""
HARMLESS_FLAGS = frozenset({"COMPLETING", "PLANNED", "RESERVED"})
"""State flags that leave a node in service; any other (DRAIN, FAIL, NOT_RESPONDING, REBOOT_*, POWER*...) holds it."""
STATE = re.compile(r"[A-Z_]+(?:\+[A-Z_]+)*")
TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"
CHECK_JOB = re.compile(r"\d{1,12}")
"""A health check's Slurm job id as the hosts ledger may hold it: anything else there was altered."""


class SlurmNodesError(TrainflowError):
    """Slurm's answer about nodes that does not read as its record of them."""


@dataclass(frozen=True)
class NodeState:
    """Slurm's record of a node (scontrol show node -o), the fields that tell a hold and a repair."""

    host: str
    state: str
    """scontrol's State: IDLE, IDLE+DRAIN, DOWN+NOT_RESPONDING, MIXED..."""
    reason: str = ""
    """Why Slurm holds it (Reason), with who set it when ("x [root@2026-12-04T23:02:39]")."""
    boot: float | None = None
    """When the node last booted (BootTime; None where Slurm does not know)."""

    @property
    def in_service(self) -> bool:
        base, *flags = self.state.split("+")
        return base in IN_SERVICE and set(flags) <= HARMLESS_FLAGS

    def line(self) -> str:
        return f"{self.state}, reason {self.reason!r}" if self.reason else self.state


NodeStates = Callable[[list[str]], dict[str, NodeState]]
"""Slurm's record of each of the hosts named that it knows (launch.slurm_nodes.node_states)."""


def parse_nodes(text: str, hosts: list[str], command: str) -> dict[str, NodeState]:
    """The records `scontrol show node -o <hosts>` printed (`command`: how it was run, for the error line); a host
    Slurm does not know is absent. One SlurmNodesError for a line that is not one asked-for node's record."""
    found: dict[str, NodeState] = {}
    for line in filter(None, (line.rstrip() for line in text.splitlines())):
        if (gone := re.fullmatch(r"Node (\S+) not found", line)) and gone[1] in hosts:
            continue
        try:
            node = parse_node(line)
        except ValueError as err:
            raise SlurmNodesError(f"{command} printed {line[:120]!r}, which is no node record ({err})") from None
        if node.host not in hosts or node.host in found:
            raise SlurmNodesError(f"{command} printed a record of {node.host!r} that was not asked for or came twice")
        found[node.host] = node
    return found


def parse_node(line: str) -> NodeState:
    """One node's record; ValueError saying what is wrong. Reason is its last field and may hold spaces (so may OS:
    only whole ` Key=value` words before Reason are read, each exactly once)."""
    if not line.isprintable():
        raise ValueError("it holds control characters")
    head, _, reason = line.partition(" Reason=")  # Slurm writes it last, as text [user@time]
    values = {}
    for key, pattern in (("NodeName", HOST.pattern), ("State", STATE.pattern), ("BootTime", rf"None|{TIME}")):
        matches = re.findall(rf"(?:^| ){key}=(\S*)", head)
        if len(matches) != 1 or not re.fullmatch(pattern, matches[0]):
            raise ValueError(f"{key} {'is missing' if not matches else f'reads {matches!r}'}")
        values[key] = matches[0]
    boot = None if values["BootTime"] == "None" else time.mktime(time.strptime(values["BootTime"], SLURM_TIME))
    return NodeState(values["NodeName"], values["State"], reason[:200], boot)


class HealthChecks(Protocol):
    """How a host's health check job is run and read (launch.health_check)."""

    after_s: float
    """resilience.health_check_after_s: how long after a blame, or a failed check, a host is checked; 0: never."""

    def submit(self, host: str) -> str:
        """Submit the check of `host`; its job id ("" where it could not be submitted: said in a log line)."""

    def outcome(self, host: str, job_id: str) -> tuple[bool, str] | None:
        """(whether it passed, what it found, in one clause) once the check of `host`, job `job_id`, ended; None while
        it may run."""


def review(
    jobs: list[JobRun],
    events: list[HostEvent],
    nodes: NodeStates,
    now: float,
    gate: Mapping[str, Probation] | None = None,
    checks: HealthChecks | None = None,
) -> list[HostEvent]:
    """What Slurm shows of the hosts the run leaves out (`jobs`, `events`: its ledgers; `gate`: the gate's blames)
    that is new: a hold seen for the first time since a host's blame, or its return; and where `checks` is given,
    each health check submitted or ended (the module docstring); each for the hosts ledger. One SlurmNodesError where
    Slurm's answer does not read (the hosts stay out)."""
    out = standing(jobs, events, gate).excluded
    found = nodes(sorted(out)) if out else {}
    new = []
    for host, probation in sorted(out.items()):
        if host not in found:
            continue
        if change := changed(found[host], probation):
            new.append(HostEvent(host, now, *change, blamed_by=probation.job))
        elif checks and checks.after_s and found[host].in_service:
            new += health_checked(host, probation, [e for e in events if e.host == host], checks, now)
    return new


def health_checked(
    host: str, probation: Probation, events: list[HostEvent], checks: HealthChecks, now: float
) -> list[HostEvent]:
    """The event of a health check of `host` on probation, kept in service (its hosts ledger lines `events`): its
    check's outcome where one ran, a check submitted where one is due; none else."""
    kinds = (HostEventKind.CHECKING, HostEventKind.CHECK_FAILED)
    last = next((e for e in reversed(events) if e.at >= probation.since and e.kind in kinds), None)
    event = functools.partial(HostEvent, host, now, blamed_by=probation.job)
    if last is not None and last.kind is HostEventKind.CHECKING:
        job = last.check_job
        if not CHECK_JOB.fullmatch(job):
            return [event(HostEventKind.CHECK_FAILED, f"the hosts ledger names no check job ({job[:40]!r}): altered")]
        if (ended := checks.outcome(host, job)) is None:
            return []
        passed, found = ended
        kind = HostEventKind.RETURNED if passed else HostEventKind.CHECK_FAILED
        return [event(kind, f"its health check (job {job}) {found}", check_job=job)]
    if now - (last.at if last else probation.since) < checks.after_s or not (job := checks.submit(host)):
        return []
    return [event(HostEventKind.CHECKING, f"its health check submitted (job {job})", check_job=job)]


def changed(node: NodeState, probation: Probation) -> tuple[HostEventKind, str] | None:
    """The event Slurm's record of a host on probation makes, and its evidence; None where there is nothing new."""
    if not node.in_service:
        return None if probation.held else (HostEventKind.HELD, f"Slurm holds it out: {node.line()}")
    if node.boot is not None and node.boot > probation.since:
        why = f"Slurm rebooted it at {clock(node.boot)} and has it {node.state}"
    elif (held := probation.held) is not None:
        why = f"Slurm has it {node.state} after the hold seen at {clock(held.at)}: {held.evidence}"
    else:
        return None
    return HostEventKind.RETURNED, why


def clock(at: float) -> str:
    """`at` as Slurm writes a time; "?" for a time no clock shows (a hosts ledger that was altered)."""
    try:
        return time.strftime(SLURM_TIME, time.localtime(at))
    except (OverflowError, ValueError, OSError):
        return "?"
