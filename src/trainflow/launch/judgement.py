"""A failed job's judgement, prepared once for the stage (launch.segment_jobs) and a supervisor's hot restart
(launch.supervisor): where the run stands by its jobs ledger (restarts without progress, the transient ones apart),
the stragglers' hosts, and the node evidence of the failure's hosts, then resilience.verdict.judge.

    verdict = judgement(cfg, job, failure, earlier, history)   # evidence=: a test's own EvidenceSource

The evidence source reads the node reports the failed job's ranks wrote (launch.node_report) and Slurm's record of
each host. The reports are files of the run folder, which may be hostile: each is read bounded and without waiting
(trainflow.records.read_json: a FIFO, a folder or a file past REPORT_BYTES is one clause of that host's `unread`), and
its kernel text parsed strictly (resilience.evidence.kernel_faults); a report that does not read confirms nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import submitit

from trainflow.config import TrainflowConfig
from trainflow.launch.failure import read_markers
from trainflow.launch.node_report import NodeReport, node_report_path
from trainflow.launch.restart import straggler_hosts
from trainflow.launch.slurm_nodes import node_states
from trainflow.records import RecordError, read_json
from trainflow.resilience.evidence import KERNEL_LINES, EvidenceSource, NodeEvidence, clause, kernel_faults
from trainflow.resilience.ledger import JobRun, standing
from trainflow.resilience.probation import NodeStates, SlurmNodesError
from trainflow.resilience.verdict import JobFailure, Verdict, judge, suspects

REPORT_BYTES = 4 << 20
"""More than a node report holds (a kernel log's tail of 1 MB, escaped as JSON): a bigger one is not read."""


def judgement(
    cfg: TrainflowConfig,
    job: submitit.Job,
    failure: JobFailure,
    earlier: list[JobFailure],
    history: list[JobRun],
    *,
    slow: frozenset[str] = frozenset(),
    evidence: EvidenceSource | None = None,
) -> Verdict:
    """The verdict on `failure` of `job` (`earlier`: the segment's failures before it; `history`: the jobs ledger, the
    failed job's record last), with the hosts `slow` found besides the stragglers of resilience.exclude_stragglers."""
    r = cfg.resilience
    if r.exclude_stragglers:
        slow |= straggler_hosts(job.paths, r.straggler_factor)
    source = evidence or node_evidence(job, node_states(cfg.cluster.allocation.executor))
    found = source(sorted(suspects(failure)))
    now = standing(history)
    return judge(
        failure,
        earlier,
        max_restarts=r.max_restarts,
        restarts=now.without_progress,
        transient=now.transient,
        slow=slow,
        evidence=found,
    )


def recorded(run: JobRun, verdict: Verdict) -> JobRun:
    """The jobs ledger's record of a judged job: its verdict, the hosts it blames and its failure's class."""
    return dataclasses.replace(run, verdict=verdict.why, left_out=sorted(verdict.exclude), fault=verdict.fault)


def node_evidence(job: submitit.Job, nodes: NodeStates) -> EvidenceSource:
    """The evidence source of a failed job: its ranks' node reports (by their task markers' hosts; kernel lines since
    the job's first rank started) and Slurm's record of each host (`nodes`), read once asked."""

    def source(hosts: list[str]) -> dict[str, NodeEvidence]:
        try:
            states, slurm_unread = (nodes(hosts) if hosts else {}), []
        except SlurmNodesError as err:
            states, slurm_unread = {}, [clause(f"Slurm not read ({err})")]
        markers = read_markers(job)
        since = min((m.started for m in markers.values()), default=0.0)
        found = {}
        for host in hosts:
            reports = [node_report_path(job.task(k).paths) for k, m in sorted(markers.items()) if m.host == host]
            found[host] = host_evidence(host, [p for p in reports if p.exists() or p.is_symlink()], since)
            found[host] = dataclasses.replace(
                found[host], slurm=states.get(host), unread=found[host].unread + slurm_unread
            )
        return found

    return source


def host_evidence(host: str, reports: list[Path], since: float) -> NodeEvidence:
    """What the node reports of a host's ranks say (its kernel lines since `since`, NVML's word), each report that
    does not read one clause of `unread`."""
    kernel: list[str] = []
    nvml, fault, unread = "not checked: no rank on it wrote a node report", False, []
    for path in reports:
        try:
            report = NodeReport.from_json(read_json(path, fix="it was altered", limit=REPORT_BYTES), where=str(path))
        except (RecordError, OSError) as err:
            unread.append(clause(f"its report does not read ({err})"))
            continue
        kernel += [line for line in kernel_faults(report.kernel, since=since) if line not in kernel]
        unread += [clause(report.kernel_unread)] if report.kernel_unread else []
        if not fault:
            nvml, fault = clause(report.nvml), report.nvml_fault
    return NodeEvidence(host, kernel[-KERNEL_LINES:], nvml, fault, None, list(dict.fromkeys(unread))[:4])
