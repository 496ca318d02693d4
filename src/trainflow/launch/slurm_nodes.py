"""Slurm's record of nodes where a job is to use them: the hosts on probation before each job of a segment (a repaired
one returns: resilience.probation) and a spare before a hot restart puts a step on it (a drained or down one is
skipped).

    python -c "from trainflow.launch.slurm_nodes import scontrol_nodes; print(scontrol_nodes(['n1', 'n2']))"
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Mapping

from trainflow.resilience.ledger import JobRun, Probation, hosts_ledger, standing
from trainflow.resilience.probation import HealthChecks, NodeState, NodeStates, SlurmNodesError, parse_nodes, review

log = logging.getLogger(__name__)

SCONTROL_S = 30
"""The longest scontrol may take to answer (a busy slurmctld answers in well under a second)."""


def scontrol_nodes(hosts: list[str]) -> dict[str, NodeState]:
    """Slurm's record of each of `hosts` it knows (`scontrol show node -o`, in Slurm's standard time format); one
    SlurmNodesError where scontrol does not answer or prints anything but those records."""
    command = ["scontrol", "show", "node", "-o", ",".join(hosts)]
    try:
        out = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=SCONTROL_S,
            env={**os.environ, "SLURM_TIME_FORMAT": "standard"},
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SlurmNodesError(f"{shlex.join(command)} did not answer ({err})") from None
    return parse_nodes(out.stdout + "\n" + out.stderr, hosts, shlex.join(command))  # "Node x not found" on stdout


def no_nodes(hosts: list[str]) -> dict[str, NodeState]:
    """One machine has no Slurm: its hosts are only recorded as left out, never returned, and a spare is its host."""
    return {}


def node_states(executor: str) -> NodeStates:
    """How the nodes' states are read under cluster.allocation.executor."""
    return scontrol_nodes if executor == "slurm" else no_nodes


def on_probation(
    checkpoints: str,
    jobs: list[JobRun],
    nodes: NodeStates,
    gate: Mapping[str, Probation] | None = None,
    checks: HealthChecks | None = None,
) -> frozenset[str]:
    """The hosts the run's jobs ledger `jobs` and the gate (`gate`: launch.restart.gate_blames) still leave out, once
    the ones Slurm shows repaired, or whose health check (`checks`: launch.health_check) passed, have returned (each
    hold seen, check and return a line of the hosts ledger beside the checkpoints)."""
    ledger = hosts_ledger(checkpoints)
    events = ledger.read()
    try:
        new = review(jobs, events, nodes, time.time(), gate, checks)
    except SlurmNodesError as err:
        log.warning("Kept every blamed host out: %s", err)
        new = []
    for event in new:
        ledger.append(event)
        log.info("Host %s %s (blamed by %s): %s", event.host, event.kind, event.blamed_by, event.evidence)
    return frozenset(standing(jobs, [*events, *new], gate).excluded)


def usable_spares(spares: list[str], nodes: NodeStates) -> list[str]:
    """The spares Slurm keeps in service, in order: a drained, down or failed one is skipped, in one line each (all of
    them where Slurm's answer does not read: a step on a node in doubt would fail again)."""
    try:
        found = nodes(spares) if spares else {}
    except SlurmNodesError as err:
        log.warning("Skipped the spares %s: %s", ",".join(spares), err)
        return []
    for host in (h for h in spares if h in found and not found[h].in_service):
        log.warning("Skipped the spare %s: Slurm holds it out (%s)", host, found[host].line())
    return [h for h in spares if h not in found or found[h].in_service]
